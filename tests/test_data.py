"""torch.utils.data's API on ggrad: datasets, samplers, collation, worker processes, and
fit over a dataset loader. torch's classes are the oracle where behaviour is defined."""

import collections
import gc
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")
from torch.utils import data as tdata  # noqa: E402

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import data, nn  # noqa: E402
from ggrad.optim import Adam  # noqa: E402
from conftest import run_in_child  # noqa: E402

X = np.arange(60, dtype=np.float32).reshape(20, 3)
Y = np.arange(20) % 4
Point = collections.namedtuple("Point", "x y")


class Squares(data.Dataset):
    """A map-style dataset that is not arrays: dict samples, computed on access."""

    def __len__(self):
        return 11

    def __getitem__(self, i):
        if not 0 <= i < 11:
            raise IndexError(i)
        return {"x": np.full(2, i, np.float32), "y": i * i}


class Failing(data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError("sample 5 is broken")
        return np.float32(i)


class Pids(data.Dataset):
    """Which process read each sample, which worker, and a draw from numpy's global generator."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = data.get_worker_info()
        return os.getpid(), -1 if info is None else info.id, np.random.random(), INIT.get("id", -1)


INIT = {}


def remember_worker(worker_id):
    INIT["id"] = 10 + worker_id


class Dies(data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            os._exit(3)
        return np.float32(i)


class KilledOnItsSecondTask(data.Dataset):
    """Worker 0 (batch_size 1, two workers) reads item 0, then is killed reading item 2."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.float32(i)


class Slow(data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        time.sleep(0.5)
        return np.float32(i)


def raise_a_local_error(samples):
    class Local(Exception):  # does not pickle: comes back as a RuntimeError with the text
        pass
    raise Local("no batch")


def unpicklable_batch(samples):
    return lambda: samples


class Counter(data.IterableDataset):
    def __iter__(self):
        return iter(np.float32(i) for i in range(7))


def shards(worker_info, n=11):
    """Samples 0..n-1, split between the workers by get_worker_info (torch's recipe)."""
    start, step = (0, 1) if worker_info is None else (worker_info.id, worker_info.num_workers)
    return iter(np.float32(i) for i in range(start, n, step))


class Shards(data.IterableDataset):
    def __iter__(self):
        return shards(data.get_worker_info())

    def __len__(self):
        return 11


class TorchShards(tdata.IterableDataset):
    def __iter__(self):
        return shards(tdata.get_worker_info())


def _values(batches):
    return [tuple(t.numpy() for t in b) for b in batches]


def _same_batches(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert len(u) == len(v)
        for p, q in zip(u, v):
            np.testing.assert_array_equal(p, q)


def _workers_running():
    return [p for p in multiprocessing.active_children() if p.name.startswith("DataLoader worker")]


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ---- batching as torch's ----------------------------------------------------------------------
@pytest.mark.parametrize("batch_size,drop_last", [(6, False), (6, True), (1, False), (20, True), (32, False)])
def test_sequential_batches_equal_torch(batch_size, drop_last):
    ours = data.DataLoader(data.TensorDataset(X, Y), batch_size=batch_size, drop_last=drop_last)
    theirs = tdata.DataLoader(tdata.TensorDataset(torch.tensor(X), torch.tensor(Y)), batch_size=batch_size,
                              drop_last=drop_last)
    assert len(ours) == len(theirs)
    _same_batches(_values(ours), [(tx.numpy(), ty.numpy()) for tx, ty in theirs])


def test_len_equals_torch():
    for n, batch_size, drop_last in [(0, 3, False), (10, 3, False), (10, 3, True), (9, 3, True), (2, 5, True)]:
        ours = data.DataLoader(data.TensorDataset(np.zeros(n)), batch_size=batch_size, drop_last=drop_last)
        theirs = tdata.DataLoader(tdata.TensorDataset(torch.zeros(n)), batch_size=batch_size, drop_last=drop_last)
        assert len(ours) == len(theirs) == len(list(ours)), (n, batch_size, drop_last)
    assert len(data.DataLoader(Shards(), batch_size=4)) == 3
    assert len(data.DataLoader(Shards(), batch_size=4, drop_last=True)) == 2
    with pytest.raises(TypeError):
        len(data.DataLoader(Counter()))


def test_default_collate_equals_torch():
    rng = np.random.default_rng(0)
    samples = [({"a": rng.standard_normal(3).astype(np.float32), "b": i}, float(i) / 2, Point(i, [i, -i]), "s")
               for i in range(4)]
    ours = data.default_collate(samples)
    theirs = tdata.default_collate(samples)
    assert isinstance(ours, tuple) and isinstance(ours[2], Point)  # torch: a list, and the Point
    np.testing.assert_array_equal(ours[0]["a"], theirs[0]["a"].numpy())
    np.testing.assert_array_equal(ours[0]["b"], theirs[0]["b"].numpy())
    assert ours[0]["b"].dtype == np.int64 and ours[1].dtype == np.float64  # torch: int64, float64
    np.testing.assert_array_equal(ours[1], theirs[1].numpy())
    np.testing.assert_array_equal(ours[2].x, theirs[2].x.numpy())
    for ours_field, theirs_field in zip(ours[2].y, theirs[2].y):
        np.testing.assert_array_equal(ours_field, theirs_field.numpy())
    assert ours[3] == list(theirs[3]) == ["s"] * 4
    tensors = data.default_collate([ggrad.tensor([1.0, 2.0]), ggrad.tensor([3.0, 4.0])])
    np.testing.assert_array_equal(tensors, [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="different lengths"):
        data.default_collate([(1, 2), (3,)])
    with pytest.raises(TypeError, match="collate_fn"):
        data.default_collate([object(), object()])


def test_a_loader_yields_tensors_in_the_collated_structure():
    batches = list(data.DataLoader(Squares(), batch_size=4))
    assert [b["y"].numpy().tolist() for b in batches] == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81, 100]]
    assert isinstance(batches[0]["x"], ggrad.Tensor) and batches[0]["x"].shape == (4, 2)
    assert len(data.DataLoader(Squares())) == 11
    points = data.Subset([Point(np.float32(i), i) for i in range(4)], range(4))  # a list alone is arrays
    named = next(iter(data.DataLoader(points, batch_size=2)))
    assert isinstance(named, Point) and named.y.numpy().tolist() == [0, 1]
    words = next(iter(data.DataLoader(Squares(), batch_size=3, collate_fn=lambda s: [str(d["y"]) for d in s])))
    assert words == ["0", "1", "4"]


# ---- order and randomness ----------------------------------------------------------------------
def test_the_arrays_fast_path_keeps_its_order():
    """`DataLoader(x, y, ...)`: every epoch the next permutation of the seed's generator."""
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    loader = data.DataLoader(x, y, batch_size=4, shuffle=True, seed=1)
    rng = np.random.default_rng(1)
    for _ in range(2):
        order = rng.permutation(10)
        _same_batches(_values(loader), [(x[order[i:i + 4]], y[order[i:i + 4]]) for i in range(0, 10, 4)])
    as_dataset = data.DataLoader(data.TensorDataset(x, y), batch_size=4, shuffle=True, seed=1)
    _same_batches(_values(as_dataset), _values(data.DataLoader(x, y, batch_size=4, shuffle=True, seed=1)))
    assert len(data.DataLoader(x, y)) == 1  # 32 a batch
    with pytest.raises(ValueError, match="need a dataset"):
        data.DataLoader(x, y, num_workers=2)


def test_shuffle_with_a_seed_is_a_reproducible_permutation():
    def order(**seeding):
        return np.concatenate([b[1].numpy() for b in data.DataLoader(data.TensorDataset(X, np.arange(20)), 7,
                                                                         shuffle=True, **seeding)])
    first, again, other = order(seed=3), order(seed=3), order(seed=4)
    assert sorted(first.tolist()) == list(range(20)) and first.tolist() != list(range(20))
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, order(generator=np.random.default_rng(3)))
    assert first.tolist() != other.tolist()
    ggrad.manual_seed(5)
    unseeded = order()
    ggrad.manual_seed(5)
    np.testing.assert_array_equal(unseeded, order())


def test_samplers_equal_torch():
    assert list(data.SequentialSampler(range(5))) == list(tdata.SequentialSampler(range(5)))
    for drop_last in (False, True):
        ours = data.BatchSampler(data.SequentialSampler(range(10)), 4, drop_last=drop_last)
        theirs = tdata.BatchSampler(tdata.SequentialSampler(range(10)), 4, drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
    drawn = list(data.RandomSampler(range(5), replacement=True, num_samples=12, seed=0))
    assert len(drawn) == 12 and set(drawn) <= set(range(5))
    longer = list(data.RandomSampler(range(5), num_samples=12, seed=0))
    assert len(longer) == 12 and sorted(longer[:10]) == sorted(list(range(5)) * 2)
    sampler = data.RandomSampler(range(6), seed=2)
    epochs = [list(sampler), list(sampler)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(6)) and epochs[0] != epochs[1]
    with pytest.raises(ValueError, match="num_samples"):
        data.RandomSampler(range(0))


def test_argument_errors_as_torch():
    dataset = data.TensorDataset(X)
    for kwargs in [dict(shuffle=True, sampler=data.SequentialSampler(dataset)),
                   dict(batch_sampler=[[0, 1]], batch_size=2), dict(batch_sampler=[[0, 1]], drop_last=True),
                   dict(num_workers=-1), dict(timeout=-1), dict(persistent_workers=True)]:
        with pytest.raises(ValueError):
            tdata.DataLoader(tdata.TensorDataset(torch.tensor(X)), **kwargs)
        with pytest.raises(ValueError):
            data.DataLoader(dataset, **kwargs)
    with pytest.raises(ValueError, match="shuffle"):
        data.DataLoader(Counter(), batch_size=2, shuffle=True)
    with pytest.raises(TypeError, match="keywords"):
        data.DataLoader(dataset, 2, 3)
    assert [b[0].shape for b in data.DataLoader(dataset, 8)] == [(8, 3), (8, 3), (4, 3)]  # batch_size positional
    assert [b[0].numpy()[:, 0].tolist() for b in data.DataLoader(dataset, batch_sampler=[[3, 1], [0]])] == \
        [[9.0, 3.0], [0.0]]


# ---- worker processes -------------------------------------------------------------------------
def test_workers_give_the_batches_in_order():
    for dataset in (data.TensorDataset(X, Y), data.Subset(data.TensorDataset(X, Y), list(range(20)))):
        for shuffle in (False, True):
            serial = _values(data.DataLoader(dataset, batch_size=3, shuffle=shuffle, seed=7))
            parallel = _values(data.DataLoader(dataset, batch_size=3, shuffle=shuffle, seed=7, num_workers=2,
                                               prefetch_factor=1))
            assert len(serial) == 7
            _same_batches(serial, parallel)
    dicts = list(data.DataLoader(Squares(), batch_size=4, num_workers=2))
    assert [b["y"].numpy().tolist() for b in dicts] == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81, 100]]


def test_a_worker_error_is_raised_here_with_its_traceback():
    with pytest.raises(KeyError, match="sample 5 is broken") as caught:
        list(data.DataLoader(Failing(), batch_size=2, num_workers=2))
    text = str(caught.value)
    assert "Caught KeyError in DataLoader worker process 0" in text and "in __getitem__" in text
    assert not _workers_running()  # stopped, though the traceback still holds the loader's frame
    with pytest.raises(RuntimeError, match="(?s)Caught Local.*no batch"):
        list(data.DataLoader(Squares(), batch_size=2, num_workers=2, collate_fn=raise_a_local_error))
    with pytest.raises(RuntimeError, match="must pickle"):  # a batch that cannot be sent back
        list(data.DataLoader(Squares(), batch_size=2, num_workers=1, collate_fn=unpicklable_batch))


def test_a_dead_worker_is_reported_not_waited_for():
    with pytest.raises(RuntimeError, match="exited unexpectedly with exit code 3"):
        list(data.DataLoader(Dies(), batch_size=1, num_workers=2))
    with pytest.raises(RuntimeError, match="timed out after 0.1 s"):
        list(data.DataLoader(Slow(), batch_size=1, num_workers=1, timeout=0.1))


def test_a_worker_killed_while_tasks_are_sent_is_named_with_its_signal():
    """The loader sends worker 0 its next task after the worker was killed: a broken pipe,
    reported as torch does (which worker, which signal), not as a BrokenPipeError."""
    loader = iter(data.DataLoader(KilledOnItsSecondTask(), batch_size=1, num_workers=2))
    assert next(loader)[0].numpy().item() == 0.0
    time.sleep(1)  # worker 0 dies on item 2, already sent to it
    with pytest.raises(RuntimeError, match=r"DataLoader worker 0 \(pid \d+\) was killed by signal SIGKILL"):
        list(loader)
    assert not _workers_running()


DEVICE_TENSORS_IN_WORKERS = """
    import sys
    import numpy as np
    import ggrad
    from ggrad import data

    ggrad.set_device(sys.argv[1])

    class OnDevice(data.Dataset):
        def __init__(self):
            self.rows = {"x": ggrad.tensor(np.arange(24, dtype=np.float32).reshape(8, 3))}

        def __len__(self):
            return 8

        def __getitem__(self, i):
            return self.rows["x"][i]

    serial = [b.numpy().tolist() for b in data.DataLoader(OnDevice(), batch_size=2)]
    try:
        parallel = [b.numpy().tolist() for b in data.DataLoader(OnDevice(), batch_size=2, num_workers=2)]
    except RuntimeError as error:
        print("refused:", error)
    else:
        print("same batches" if parallel == serial else f"different batches: {parallel} vs {serial}")
"""


def test_a_dataset_of_device_tensors_is_refused_before_workers_fork(dev):
    """Forked workers inherit Vulkan handles without the driver's state: reading them crashed
    a worker or gave another batch's rows. On the CPU they are plain memory and work."""
    out = run_in_child(DEVICE_TENSORS_IN_WORKERS, dev, timeout=120)
    if dev == "cpu":
        assert out.strip() == "same batches"
    else:
        assert out.startswith("refused:"), out
        assert f"dataset.rows['x'] is a ggrad tensor on {dev}" in out and "forked" in out


def test_workers_are_seeded_sharded_and_stopped():
    loader = data.DataLoader(Pids(), batch_size=1, num_workers=2, worker_init_fn=remember_worker)
    rows = [tuple(v.numpy().item() for v in b) for b in loader]
    pids = {r[0] for r in rows}
    assert os.getpid() not in pids and len(pids) == 2
    assert [r[1] for r in rows] == [0, 1] * 4 and [r[3] for r in rows] == [10, 11] * 4  # batch k: worker k % 2
    assert rows[0][2] != rows[1][2]  # each worker its own numpy seed
    assert all(_gone(pid) for pid in pids)  # stopped at the end of the iteration

    stopped = iter(data.DataLoader(Pids(), batch_size=1, num_workers=2))
    first = next(stopped)[0].numpy().item()
    del stopped
    gc.collect()
    assert _gone(first)  # and when an unfinished iteration is dropped

    persistent = data.DataLoader(Pids(), batch_size=4, num_workers=2, persistent_workers=True)
    epochs = [{int(p) for b in persistent for p in b[0].numpy()} for _ in range(2)]
    assert epochs[0] == epochs[1] and len(epochs[0]) == 2 and not any(_gone(p) for p in epochs[0])
    del persistent
    gc.collect()
    assert all(_gone(pid) for pid in epochs[0])  # with the loader


def test_iterable_datasets_as_torch_with_and_without_workers():
    assert [b.numpy().tolist() for b in data.DataLoader(Counter(), batch_size=3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [b.numpy().tolist() for b in data.DataLoader(Counter(), batch_size=3, drop_last=True)] == \
        [[0, 1, 2], [3, 4, 5]]
    for workers in (0, 2):
        ours = [b.numpy().tolist() for b in data.DataLoader(Shards(), batch_size=3, num_workers=workers)]
        theirs = [b.numpy().tolist() for b in tdata.DataLoader(TorchShards(), batch_size=3, num_workers=workers)]
        assert ours == theirs, workers
    assert [[0, 2, 4], [1, 3, 5]] == theirs[:2]  # the workers' batches interleaved
    persistent = data.DataLoader(Shards(), batch_size=3, num_workers=2, persistent_workers=True)
    assert [b.numpy().tolist() for b in persistent] == [b.numpy().tolist() for b in persistent] == ours


# ---- datasets --------------------------------------------------------------------------------
def test_random_split_sizes_as_torch():
    for n, lengths in [(20, [0.5, 0.3, 0.2]), (10, [0.33, 0.33, 0.34]), (7, [0.25, 0.25, 0.5]), (20, [15, 5])]:
        ours = data.random_split(data.TensorDataset(X[:n]), lengths, seed=0)
        theirs = tdata.random_split(tdata.TensorDataset(torch.tensor(X[:n])), lengths)
        assert [len(p) for p in ours] == [len(p) for p in theirs], lengths
    parts = data.random_split(data.TensorDataset(X), [0.5, 0.3, 0.2], seed=0)
    seen = sorted(int(p[i][0][0]) // 3 for p in parts for i in range(len(p)))
    assert seen == list(range(20))  # disjoint, complete
    again = data.random_split(data.TensorDataset(X), [0.5, 0.3, 0.2], np.random.default_rng(0))
    assert [p.indices for p in parts] == [p.indices for p in again]
    with pytest.raises(ValueError, match="add up"):
        data.random_split(data.TensorDataset(X), [5, 5])
    with pytest.raises(ValueError, match="not both"):
        data.random_split(data.TensorDataset(X), [10, 10], np.random.default_rng(0), seed=0)


def test_concat_subset_and_tensor_dataset_index_as_torch():
    ours = data.TensorDataset(X[:4]) + data.Subset(data.TensorDataset(X), [10, 11, 2])
    theirs = tdata.TensorDataset(torch.tensor(X[:4])) + tdata.Subset(tdata.TensorDataset(torch.tensor(X)),
                                                                     [10, 11, 2])
    assert len(ours) == len(theirs) == 7 and ours.cumulative_sizes == theirs.cumulative_sizes
    for i in range(-7, 7):
        np.testing.assert_array_equal(ours[i][0], theirs[i][0].numpy())
    for bad in (7, -8):
        with pytest.raises(IndexError):
            ours[bad]
    np.testing.assert_array_equal(data.Subset(data.TensorDataset(X), [4, 6])[[1, 0]][0], X[[6, 4]])
    with pytest.raises(TypeError, match="IterableDataset"):
        data.ConcatDataset([Counter()])
    with pytest.raises(ValueError, match="first dimension"):
        data.TensorDataset(X, Y[:3])
    np.testing.assert_array_equal(data.TensorDataset(ggrad.tensor(X))[2][0], X[2])  # tensors read to numpy


# ---- training --------------------------------------------------------------------------------
def test_fit_trains_on_a_dataset_loader():
    """The same shuffled batches through two worker processes train the same model."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    histories = []
    for workers in (0, 2):
        ggrad.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        loader = data.DataLoader(data.TensorDataset(x, y), batch_size=16, shuffle=True, seed=0,
                                 num_workers=workers, persistent_workers=workers > 0)
        histories.append(ggrad.fit(model, F.cross_entropy, Adam(model.parameters(), lr=5e-2), loader, epochs=8,
                                   verbose=0)["loss"])
    assert histories[0][-1] < 0.5 * histories[0][0]
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-6)


def test_pinned_batches_are_the_batches_uploaded_once_from_reused_pinned_memory(dev):
    """pin_memory=True: on a device with pinned host memory (Vulkan, CUDA) each batch waits
    there, is uploaded with one counted crossing as an unpinned one, and holds the same
    values; the pinned blocks are reused, epoch after epoch. The CPU has none: unchanged."""
    from ggrad.runtime import pinned
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((300, 70)).astype(np.float32), rng.integers(0, 9, 300)
    has_pinned = ggrad.runtime.current().backend.host_memory is False
    for loader in (ggrad.DataLoader(x, y, batch_size=64, pin_memory=True),
                   ggrad.DataLoader(data.TensorDataset(x, y), batch_size=64, pin_memory=True),
                   ggrad.DataLoader(data.TensorDataset(x, y), batch_size=64, pin_memory=True, num_workers=1)):
        held = []
        for epoch in range(3):
            rows, targets = [], []
            for xb, yb in loader:
                assert xb.is_pinned() == yb.is_pinned() == has_pinned
                with ggrad.count_transfers() as counts:
                    total = (xb * 2).sum()
                    total.handle  # noqa: B018
                assert counts.uploads == (1 if has_pinned else 0) and not xb.is_pinned()  # uploaded: left it
                rows.append(xb.numpy())
                targets.append(yb.numpy())
            np.testing.assert_array_equal(np.concatenate(rows), x)
            np.testing.assert_array_equal(np.concatenate(targets), y)
            del xb, yb
            gc.collect()
            held.append(pinned.cached_bytes())
        assert held[0] == held[1] == held[2]  # the blocks of an epoch serve the next
        assert (held[0] > 0) == has_pinned


def test_pin_memory_of_a_tensor_as_torch(dev):
    a = ggrad.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    p = a.pin_memory()
    has_pinned = ggrad.runtime.current().backend.host_memory is False
    assert p.is_pinned() == has_pinned and (p is a) != has_pinned and not a.is_pinned()
    np.testing.assert_array_equal(p.numpy(), np.arange(12).reshape(3, 4))
    computed = a * 2
    assert computed.pin_memory() is computed and not computed.is_pinned()
    assert p.pin_memory() is p
