"""`fit`, `DataLoader`, `evaluate` and `save` under a process group: one mpiexec launch of
2 ranks (started here, with a timeout) trains with DDP and reports; the tests compare it
with one process fitting the same data with the doubled batch."""

import json
import re

import numpy as np
import pytest

import ggrad
import ggrad.functional as F
from ggrad import data, nn
from ggrad.distributed import DistributedSampler
from ggrad.optim import Adam

from test_distributed import mpirun, needs_mpi

PER_RANK, EPOCHS = 4, 3

RANKS = """
    import json, os, sys
    os.environ.setdefault("GGRAD_NUM_THREADS", "1")  # the ranks share the cores: no ggml threads spinning
    import numpy as np, ggrad, ggrad.functional as F, ggrad.io
    from ggrad import data, nn, distributed as dist
    from ggrad.optim import Adam
    out, per_rank, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group()
    ggrad.set_device("cpu")
    rank = dist.get_rank()
    report = {"loader": {}}

    # the loader: each rank its shard, reshuffled per epoch alike; an explicit sampler wins
    xs, ys = np.arange(10.0, dtype=np.float32).reshape(10, 1), np.arange(10)
    for name, loader in [("arrays", ggrad.DataLoader(xs, ys, batch_size=3, shuffle=True, seed=7)),
                         ("dataset", ggrad.DataLoader(data.TensorDataset(xs, ys), batch_size=3, shuffle=True, seed=7)),
                         ("ordered", ggrad.DataLoader(xs, ys, batch_size=3)),
                         ("chosen", ggrad.DataLoader(xs, ys, batch_size=4, sampler=range(10)))]:
        report["loader"][name] = [[b[1].numpy().tolist() for b in loader] for epoch in range(2)]
        report["loader"][name + "_len"] = len(loader)

    real_write = ggrad.io._atomic_write
    def spy(path, write):  # who writes files
        print(f"write-{rank}-{os.path.basename(path)}", flush=True)
        return real_write(path, write)
    ggrad.io._atomic_write = spy

    rng = np.random.default_rng(0)
    x = rng.standard_normal((20 * per_rank, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    xv = rng.standard_normal((13, 6)).astype(np.float32)  # 7 rows on rank 0, 6 on rank 1
    yv = (xv[:, 0] > 0).astype(np.int64)
    bad = x.copy()
    bad[5, 0] = np.nan  # one step an epoch is skipped, on both ranks: DDP averages the NaN gradient
    for run, train in [("ordered", ggrad.DataLoader(x, y, batch_size=per_rank)), ("shuffled", (bad, y))]:
        ggrad.manual_seed(rank)  # different weights on each rank: DDP broadcasts rank 0's
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
        if rank == 0:
            np.savez(f"{out}/{run}-init.npz", *[p.numpy() for p in model.parameters()])
        ddp = dist.DistributedDataParallel(model)
        opt = Adam(model.parameters(), lr=0.01)
        print(f"fit-{run}", flush=True)
        history = ggrad.fit(ddp, F.cross_entropy, opt, train, epochs=epochs, batch_size=per_rank,
                            val_data=(xv, yv), metrics=("loss", "accuracy"), verbose=1,
                            on_nonfinite="raise" if run == "ordered" else "skip",
                            callbacks=[ggrad.ModelCheckpoint(f"{out}/{run}-best.safetensors")])
        report[run] = history.history
        np.savez(f"{out}/{run}-{rank}.npz", *[p.numpy() for p in model.parameters()])
    report["evaluate"] = ggrad.evaluate(model, F.cross_entropy, (xv, yv), metrics=("loss", "accuracy"))

    path = ggrad.save(model, f"{out}/final.safetensors")  # every rank may load it once save returns
    loaded = ggrad.load(path)
    report["loaded"] = all(np.array_equal(loaded[k], v.numpy()) for k, v in model.state_dict().items())
    with open(f"{out}/report-{rank}.json", "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The 2-rank run: its stdout and each rank's report."""
    out = tmp_path_factory.mktemp("ranks")
    proc = mpirun(2, RANKS, str(out), str(PER_RANK), str(EPOCHS), timeout=150)
    reports = [json.loads((out / f"report-{r}.json").read_text()) for r in range(2)]
    return out, proc.stdout, reports


def one_process(init, shuffled: bool):
    """The same training in one process with the doubled batch: per step, the rows both
    ranks had (shuffled: epoch e's permutation is DistributedSampler's, seed 0 + e; row 5
    is NaN and its step skipped)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20 * PER_RANK, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    xv = rng.standard_normal((13, 6)).astype(np.float32)
    yv = (xv[:, 0] > 0).astype(np.int64)
    if shuffled:
        x[5, 0] = np.nan
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    with ggrad.no_grad():
        for p, value in zip(model.parameters(), init):
            p.assign_(value)
    opt = Adam(model.parameters(), lr=0.01)
    sampler = DistributedSampler(x, num_replicas=1, rank=0, shuffle=shuffled)
    loader = ggrad.DataLoader(x, y, batch_size=2 * PER_RANK, sampler=sampler)
    history = {}
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        h = ggrad.fit(model, F.cross_entropy, opt, loader, epochs=1, val_data=(xv, yv), batch_size=8,
                      metrics=("loss", "accuracy"), verbose=0, on_nonfinite="skip" if shuffled else "raise")
        for k, v in h.history.items():
            history.setdefault(k, []).extend(v)
    return [p.numpy() for p in model.parameters()], history


@needs_mpi
@pytest.mark.parametrize("run", ["ordered", "shuffled"])
def test_two_ranks_with_ddp_fit_the_weights_and_logs_of_one_process_with_the_double_batch(ranks, run):
    out, _, reports = ranks
    init = list(np.load(out / f"{run}-init.npz").values())
    expected, history = one_process(init, shuffled=run == "shuffled")
    for rank in range(2):
        got = list(np.load(out / f"{run}-{rank}.npz").values())
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    # every rank logs the same global means: one process's over all the rows (validation
    # shared 7 + 6 rows, no padding)
    assert reports[0][run] == reports[1][run]
    assert set(reports[0][run]) == {"loss", "accuracy", "val_loss", "val_accuracy", "lr"} | \
        ({"skipped"} if run == "shuffled" else set())  # the shuffled run guards its steps
    if run == "shuffled":
        assert history["skipped"] == [1] * EPOCHS
    for key, values in history.items():
        np.testing.assert_allclose(reports[0][run][key], values, rtol=1e-5, err_msg=key)


@needs_mpi
def test_evaluate_is_shared_and_reduced(ranks):
    _, _, reports = ranks
    assert reports[0]["evaluate"] == reports[1]["evaluate"]
    assert reports[0]["evaluate"]["accuracy"] * 13 == pytest.approx(round(reports[0]["evaluate"]["accuracy"] * 13))
    assert reports[0]["evaluate"]["loss"] == pytest.approx(reports[0]["shuffled"]["val_loss"][-1], rel=1e-6)


@needs_mpi
def test_only_rank_0_prints_and_writes_and_save_waits_for_it(ranks):
    _, stdout, reports = ranks
    assert len(re.findall(r"^epoch \d/\d: ", stdout, re.M)) == 2 * EPOCHS  # two fits, one line an epoch
    writes = re.findall(r"^write-(\d)-(\S+)$", stdout, re.M)
    assert writes and {rank for rank, _ in writes} == {"0"}
    assert {name for _, name in writes} == {"ordered-best.safetensors", "shuffled-best.safetensors",
                                            "final.safetensors"}
    assert reports[0]["loaded"] and reports[1]["loaded"]  # rank 1 read what rank 0 had written


@needs_mpi
def test_the_loader_shards_and_reshuffles_each_epoch_alike_on_every_rank(ranks):
    _, _, reports = ranks

    def batches(indices, size):
        return [indices[i:i + size] for i in range(0, len(indices), size)]

    for epoch in range(2):
        shards = []
        for rank, report in enumerate(r["loader"] for r in reports):
            sampler = DistributedSampler(range(10), num_replicas=2, rank=rank, seed=7)
            sampler.set_epoch(epoch)
            assert report["arrays"][epoch] == batches(list(sampler), 3)
            assert report["dataset"][epoch] == report["arrays"][epoch]
            assert report["ordered"][epoch] == batches(list(range(rank, 10, 2)), 3)
            assert report["chosen"][epoch] == batches(list(range(10)), 4)  # an explicit sampler wins
            assert report["arrays_len"] == report["dataset_len"] == 2
            shards.append(sum(report["arrays"][epoch], []))
        assert sorted(shards[0] + shards[1]) == list(range(10))
    assert reports[0]["loader"]["arrays"][0] != reports[0]["loader"]["arrays"][1]  # a new permutation each epoch


def test_an_explicit_sampler_picks_the_rows_of_arrays():
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    loader = data.DataLoader(x, y, batch_size=3, sampler=[9, 1, 4, 4])
    assert len(loader) == 2
    assert [b[1].numpy().tolist() for b in loader] == [[9, 1, 4], [4]]
    with pytest.raises(ValueError, match="need a dataset"):
        data.DataLoader(x, y, batch_size=1, batch_sampler=[[0, 1]])
