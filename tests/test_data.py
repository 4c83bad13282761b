"""torch.utils.data's API on ggrad: datasets, samplers, collation, worker processes, and
fit over a dataset loader. torch's classes are the oracle where behaviour is defined."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")
from torch.utils import data as tdata  # noqa: E402

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import data, nn  # noqa: E402
from ggrad.optim import Adam  # noqa: E402

X = np.arange(60, dtype=np.float32).reshape(20, 3)
Y = np.arange(20) % 4


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


class Counter(data.IterableDataset):
    def __iter__(self):
        return iter(np.float32(i) for i in range(7))


def _values(batches):
    return [tuple(t.numpy() for t in b) for b in batches]


def test_sequential_batches_equal_torch():
    ours = data.DataLoader(data.TensorDataset(X, Y), batch_size=6, drop_last=False)
    theirs = tdata.DataLoader(tdata.TensorDataset(torch.tensor(X), torch.tensor(Y)), batch_size=6)
    assert len(ours) == len(theirs) == 4
    for (gx, gy), (tx, ty) in zip(_values(ours), theirs):
        np.testing.assert_array_equal(gx, tx.numpy())
        np.testing.assert_array_equal(gy, ty.numpy())
    assert len(data.DataLoader(data.TensorDataset(X, Y), 6, drop_last=True)) == 3


def test_collation_of_dicts_and_batch_size_default_one():
    batches = list(data.DataLoader(Squares(), batch_size=4))
    assert [b["y"].numpy().tolist() for b in batches] == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81, 100]]
    assert batches[0]["x"].shape == (4, 2)
    assert len(data.DataLoader(Squares())) == 11


def test_shuffle_with_a_seed_is_a_reproducible_permutation():
    def order(seed):
        return np.concatenate([b[1].numpy() for b in data.DataLoader(data.TensorDataset(X, np.arange(20)), 7,
                                                                         shuffle=True, seed=seed)])
    first, again, other = order(3), order(3), order(4)
    assert sorted(first.tolist()) == list(range(20)) and first.tolist() != list(range(20))
    np.testing.assert_array_equal(first, again)
    assert first.tolist() != other.tolist()


def test_workers_give_the_batches_in_order():
    serial = _values(data.DataLoader(data.TensorDataset(X, Y), batch_size=3))
    parallel = _values(data.DataLoader(data.TensorDataset(X, Y), batch_size=3, num_workers=2))
    assert len(serial) == len(parallel) == 7
    for a, b in zip(serial, parallel):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)


def test_a_worker_error_is_raised_here():
    with pytest.raises(KeyError, match="sample 5 is broken"):
        list(data.DataLoader(Failing(), batch_size=2, num_workers=2))


def test_iterable_datasets_and_samplers():
    assert [b.numpy().tolist() for b in data.DataLoader(Counter(), batch_size=3)] == [[0, 1, 2], [3, 4, 5], [6]]
    batches = data.BatchSampler(data.SequentialSampler(range(10)), 4, drop_last=False)
    assert list(batches) == list(tdata.BatchSampler(tdata.SequentialSampler(range(10)), 4, False))
    assert len(batches) == 3
    drawn = list(data.RandomSampler(range(5), replacement=True, num_samples=12, seed=0))
    assert len(drawn) == 12 and set(drawn) <= set(range(5))
    with pytest.raises(ValueError, match="shuffle"):
        data.DataLoader(Counter(), batch_size=2, shuffle=True)


def test_random_split_subset_concat():
    parts = data.random_split(data.TensorDataset(X), [0.5, 0.3, 0.2], seed=0)
    torch_parts = tdata.random_split(tdata.TensorDataset(torch.tensor(X)), [0.5, 0.3, 0.2])
    assert [len(p) for p in parts] == [len(p) for p in torch_parts] == [10, 6, 4]
    seen = sorted(int(p[i][0][0]) // 3 for p in parts for i in range(len(p)))
    assert seen == list(range(20))  # disjoint, complete
    with pytest.raises(ValueError, match="add up"):
        data.random_split(data.TensorDataset(X), [5, 5])
    joined = data.TensorDataset(X[:4]) + data.Subset(data.TensorDataset(X), [10, 11])
    assert len(joined) == 6 and joined[4][0][0] == X[10][0] and joined[-1][0][0] == X[11][0]
    with pytest.raises(IndexError):
        joined[6]


def test_fit_trains_on_a_dataset_loader():
    ggrad.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    loader = data.DataLoader(data.TensorDataset(x, y), batch_size=16, shuffle=True, seed=0)
    history = ggrad.fit(model, F.cross_entropy, Adam(model.parameters(), lr=5e-2), loader, epochs=15, verbose=0)
    assert history["loss"][-1] < 0.5 * history["loss"][0]
