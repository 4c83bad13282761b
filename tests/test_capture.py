"""ggrad.compile: a replayed step computes exactly what the traced Python computes, runs
as one dispatch with nothing crossing, and notices when it no longer holds."""

import ctypes
import warnings

import numpy as np
import pytest
from ggml import ggml as G

import ggrad
import ggrad.functional as F
from conftest import run_in_child
from ggrad import nn
from ggrad.optim import SGD, Adam, AdamW
from ggrad.optim.lr_scheduler import StepLR

SIZES = [12, 16, 16, 5]
BATCH = 8


def batches(n=6, seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, SIZES[0])).astype(np.float32),
             rng.integers(0, SIZES[-1], batch)) for _ in range(n)]


def mlp(seed=1):
    ggrad.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(SIZES) - 2 else [])
    return nn.Sequential(*layers)


def train_step(model, opt, compiled: bool):
    def step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return ggrad.compile(step) if compiled else step


def warmed_up(calls: int = 3, compiled: bool = True, **adam):
    """A compiled (or eager) Adam step on the MLP, called `calls` times: (model, opt, step, data)."""
    model = mlp()
    opt = Adam(model.parameters(), **{"lr": 1e-2, **adam})
    step = train_step(model, opt, compiled)
    data = batches()
    for i in range(calls):
        step(*data[i])
    return model, opt, step, data


def run_both(make_opt, steps=12, between=None, data=None):
    """The same training run eagerly and compiled; returns both (losses, model, opt)."""
    data = data or batches()
    runs = []
    for compiled in (False, True):
        model = mlp()
        opt = make_opt(model.parameters())
        step = train_step(model, opt, compiled)
        losses = []
        for i in range(steps):
            if between is not None:
                between(i, opt)
            losses.append(step(*data[i % len(data)]))
        runs.append(([loss.item() for loss in losses], model, opt, step))
    return runs


OPTIMIZERS = {
    "adam": lambda p: Adam(p, lr=1e-2),
    "adam-fused": lambda p: Adam(p, lr=1e-2, fused=True),
    "adamw-amsgrad": lambda p: AdamW(p, lr=1e-2, amsgrad=True),
    "sgd-nesterov": lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam-accumulate-3": lambda p: Adam(p, lr=1e-2, accumulate_steps=3),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_replayed_step_equals_the_traced_python_exactly(dev, name):
    (eager, m_eager, o_eager, _), (compiled, m_comp, o_comp, step) = run_both(OPTIMIZERS[name])
    assert step.captured >= 1, step.reason
    assert compiled == eager  # bit for bit: the same graph over the same buffers
    for a, b in zip(m_eager.parameters(), m_comp.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for p_e, p_c in zip(m_eager.parameters(), m_comp.parameters()):
        assert o_comp.state[p_c]["step"] == o_eager.state[p_e]["step"]
    assert o_comp._micro_steps == o_eager._micro_steps == 12


def _first_state_tensor_replaced(opt):
    state = opt.state[opt.param_groups[0]["params"][0]]
    key = next(k for k, v in state.items() if isinstance(v, ggrad.Tensor))
    state[key] = ggrad.ones_like(state[key]) * 1e-3


CHANGES = {  # what a user may change between steps, each seen by a replay as the eager step sees it
    "weight_decay": lambda opt: opt.param_groups[0].__setitem__("weight_decay", 0.05),
    "betas": lambda opt: opt.param_groups[0].__setitem__("betas", (0.8, 0.99)),
    "state tensor": _first_state_tensor_replaced,
    "step count": lambda opt: opt.state[opt.param_groups[0]["params"][0]].__setitem__("step", 1),
    "frozen": lambda opt: opt.param_groups[0]["params"][0].requires_grad_(False),
    "parameter dropped": lambda opt: opt.param_groups[0]["params"].pop(0),
    "state table": lambda opt: setattr(opt, "state", {p: {k: ggrad.ones_like(v) * 1e-3 if isinstance(v, ggrad.Tensor)
                                                         else v for k, v in s.items()} for p, s in opt.state.items()}),
    "group replaced": lambda opt: opt.param_groups.__setitem__(0, dict(opt.param_groups[0], weight_decay=0.05)),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_to_the_optimizer_after_many_replays_reaches_the_next_step(dev, change):
    """A replay compares what the optimizer's graph baked in only after one of the
    optimizer's own dicts changed (`optimizer._Watched`), the rest at every call: a change
    made after six replays (the check long settled) trains as the eager step does."""
    def between(i, opt):
        if i == 0:
            opt._kept_step = False  # no step runs a kept graph outside the compiled call
        if i == 8:
            CHANGES[change](opt)
    (eager, m_eager, _, _), (compiled, m_comp, _, step) = run_both(
        lambda p: Adam(p, lr=1e-2), steps=12, between=between)
    assert step.traces >= 2, step.traces
    assert compiled == eager
    for a, b in zip(m_eager.parameters(), m_comp.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("name", ["adam", "adam-fused", "sgd-nesterov", "adam-accumulate-3"])
def test_replays_compare_the_optimizers_dicts_only_after_one_changed(dev, monkeypatch, name):
    """A replay's own bookkeeping (step counts, a scheduler's lr) moves none of the
    optimizer's watched dicts: once settled, replays stop comparing every state entry."""
    from ggrad.optim.optimizer import Optimizer
    model = mlp()
    opt = OPTIMIZERS[name](model.parameters())
    step = train_step(model, opt, True)
    sched = StepLR(opt, step_size=1, gamma=0.9)
    data = batches()
    for i in range(8):
        step(*data[i % len(data)])
        sched.step()
    compared, traces = [], step.traces
    monkeypatch.setattr(Optimizer, "_bindings", lambda self: compared.append(1) or [])
    for i in range(6):
        step(*data[i % len(data)])
        sched.step()
    assert step.traces == traces and not compared


@pytest.mark.filterwarnings("ignore:ggrad.compile")  # the whole-model step is refused once counts differ
def test_two_compiled_steps_over_different_parameters_of_one_optimizer_train_as_eager(dev):
    """Two compiled steps share an optimizer, one over the last layer only: its steps
    move some step counts and not the others, which the whole-model step's next calls
    see (a parameter that skipped steps has bias corrections of its own), and every loss
    and weight equals the eager steps'."""
    data = batches()
    rng = np.random.default_rng(7)
    hidden = [rng.standard_normal((BATCH, SIZES[-2])).astype(np.float32) for _ in range(3)]
    runs = []
    for compiled in (False, True):
        model = mlp()
        opt = Adam(model.parameters(), lr=1e-2)
        if not compiled:
            opt._kept_step = False

        def head(h, y):
            with ggrad.grad_tape():
                loss = F.cross_entropy(model[-1](h), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        whole = train_step(model, opt, compiled)
        head = ggrad.compile(head) if compiled else head
        losses = [whole(*data[i % 6]).item() for i in range(4)]
        for i in range(6):
            losses.append(head(hidden[i % 3], data[i % 6][1]).item() if i % 2 else whole(*data[i % 6]).item())
        runs.append((losses, [p.numpy() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)


def test_accumulation_keeps_one_graph_per_phase(dev):
    *_, (_, _, _, step) = run_both(OPTIMIZERS["adam-accumulate-3"], steps=15)
    assert step.captured == 2  # an accumulating micro-step and the applying one


def test_a_learning_rate_schedule_reaches_the_replayed_step(dev):
    schedulers = {}

    def between(i, opt):
        sched = schedulers.setdefault(id(opt), StepLR(opt, step_size=1, gamma=0.5))
        if i:
            sched.step()
    (eager, m_e, *_), (compiled, m_c, _, step) = run_both(OPTIMIZERS["adam"], between=between)
    assert compiled == eager
    for a, b in zip(m_e.parameters(), m_c.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_step_is_checked_against_a_float64_reference(dev):
    """SGD on a linear least-squares model, replayed, against numpy in float64."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((3, 4))
    xs = [rng.standard_normal((6, 4)) for _ in range(5)]
    ys = [rng.standard_normal((6, 3)) for _ in range(5)]
    w = ggrad.param(w0.astype(np.float32))
    opt = SGD([w], lr=0.05)

    @ggrad.compile
    def step(x, y):
        with ggrad.grad_tape():
            loss = F.mse_loss(x @ w.T, y)
            loss.backward()
        opt.step()
        opt.zero_grad()

    ref = w0.copy()
    for i in range(10):
        x, y = xs[i % 5], ys[i % 5]
        step(x.astype(np.float32), y.astype(np.float32))
        ref -= 0.05 * 2 * (x @ ref.T - y).T @ x / y.size
    assert step.captured == 1
    np.testing.assert_allclose(w.numpy(), ref, rtol=2e-5, atol=2e-5 if dev != "cuda:0" else 3e-3)


def test_a_replay_is_one_dispatch_in_place_with_no_crossing(dev):
    model = mlp()
    opt = Adam(model.parameters(), lr=1e-2, fused=True)
    step = train_step(model, opt, True)
    data = [(ggrad.tensor(x), ggrad.tensor(y)) for x, y in batches()]
    for x, y in data:  # device-resident batches
        x.handle, y.handle  # noqa: B018
    for i in range(3):
        step(*data[i])
    ptrs = [p.handle.ptr for p in model.parameters()]
    memory = ggrad.runtime.memory()
    with ggrad.count_transfers() as counts:
        for i in range(12):
            step(*data[i % len(data)])
    assert counts.dispatches == 12
    assert counts.crossings == 0
    assert [p.handle.ptr for p in model.parameters()] == ptrs
    after = ggrad.runtime.memory()
    assert after["persistent_bytes"] == memory["persistent_bytes"]
    assert after["scratch_bytes"] == memory["scratch_bytes"] > 0  # the kept graph's, counted


def test_a_loop_holding_its_last_loss_reuses_the_result_before_it_and_reads_each_right(dev):
    """`loss = step(x, y)` holds the previous loss while the next call runs: a replay writes
    into the result before it (no new buffer a step), never into a loss still held."""
    data = batches()
    eager = run_both(lambda p: Adam(p, lr=1e-2), steps=14, data=data)[0][0]
    model = mlp()
    step = train_step(model, Adam(model.parameters(), lr=1e-2), True)
    loss, buffers, held = None, [], []
    for i in range(14):
        previous, loss = loss, step(*data[i % len(data)])
        if previous is not None:
            assert previous.item() == eager[i - 1]  # held through the call: not written over
        buffers.append(loss.node.handle)
        if i in (8, 10):
            held.append((i, loss))  # kept longer: their buffers stay theirs
        del previous
    assert all(buffers[i] is buffers[i - 2] for i in range(4, 9))  # two buffers in turn, none new
    assert [held_loss.item() for _, held_loss in held] == [eager[i] for i, _ in held]
    assert loss.item() == eager[-1]


@pytest.mark.parametrize("stable", [False, True])
def test_stable_addresses_keep_every_slot_in_place_and_compute_what_rebinding_computes(dev, monkeypatch, stable):
    """Where a backend keeps a graph launch only while its buffers stay put (CUDA graphs;
    forced here on every device), device batches are copied into the capture's own buffers
    and results written into two buffers in turn, each turn's graph its own: a turn's slots
    never move, and the losses (held across calls, read later) are the eager run's."""
    monkeypatch.setattr(ggrad.capture, "STABLE_ADDRESS_KINDS",
                        frozenset({ggrad.runtime.current().backend.info.kind} if stable else ()))
    data = batches()
    eager = run_both(lambda p: Adam(p, lr=1e-2), steps=10, data=data)[0][0]
    model = mlp()
    step = train_step(model, Adam(model.parameters(), lr=1e-2), True)
    resident = [(ggrad.tensor(x), ggrad.tensor(y)) for x, y in data]
    ggrad.realize(*[t for batch in resident for t in batch])
    losses, slots = [], []
    for i in range(10):
        losses.append(step(*resident[i % len(resident)]))
        graph = step._captures and next(iter(step._captures.values()))[0].graphs[-1]
        slots.append(list(graph._bound) if graph else None)
    assert [loss.item() for loss in losses] == eager
    moved = [i for i in range(4, 10) if slots[i] != slots[i - 2]]
    assert not moved if stable else moved, moved
    if stable:  # the two turns: ggml graphs led by different nodes (ggml-cuda's key)
        assert slots[8] != slots[9]
        first = [G.ggml_graph_node(g, 0) for g in (graph.graph, graph._twin[1])]
        assert ctypes.addressof(first[0].contents) != ctypes.addressof(first[1].contents)


def test_both_turns_of_a_stable_replay_fuse_as_the_graph_does(dev):
    """With stable addresses every other replay runs the twin graph (`Graph.compute_twin`).
    Built with ggml's use counts, ggml-vulkan fuses its nodes as in the graph itself (a twin
    of nodes added bare fused nothing: every other step of a CUDA loop ran unfused). Its perf
    logger names what each compute ran, fused ops included."""
    if not dev.startswith("vulkan"):
        pytest.skip("ggml-vulkan's perf logger names the fused ops")
    out = run_in_child("""
        import os, sys
        os.environ["GGML_VK_PERF_LOGGER"] = "1"
        os.dup2(1, 2)
        import numpy as np
        import ggrad
        ggrad.set_device(sys.argv[1])
        ggrad.capture.STABLE_ADDRESS_KINDS = frozenset({"vulkan"})
        rng = np.random.default_rng(0)
        w = ggrad.tensor(rng.standard_normal((16, 16)).astype(np.float32))
        b, c = (ggrad.tensor(rng.standard_normal(16).astype(np.float32)) for _ in range(2))
        f = ggrad.compile(lambda x: ((x @ w + b) + c + x).sum(1))
        for i in range(5):
            print("call", i, flush=True)
            f(rng.standard_normal((1, 16)).astype(np.float32)).numpy()
    """, dev)
    calls = out.split("call ")[2:]  # the replays: turns 1, 0, 1, 0
    assert len(calls) == 4 and all("MULTI_ADD" in call for call in calls), out[-3000:]


def test_stable_addresses_take_two_buffers_in_turn_and_move_out_only_a_result_held_two_calls(dev, monkeypatch):
    """With stable addresses (forced here on every device), results take two buffers in
    turn: a loop holding its last loss (`loss = step(x, y)`) costs no copy; a result still
    held when its buffer's turn comes back is copied out once and keeps its value."""
    monkeypatch.setattr(ggrad.capture, "STABLE_ADDRESS_KINDS", frozenset({ggrad.runtime.current().backend.info.kind}))
    data = batches()
    eager = run_both(lambda p: Adam(p, lr=1e-2), steps=13, data=data)[0][0]
    copies = []
    copy_from = ggrad.runtime.handle.Handle.copy_from
    monkeypatch.setattr(ggrad.runtime.handle.Handle, "copy_from", lambda h, src: (copies.append(h), copy_from(h, src)))
    model = mlp()
    step = train_step(model, Adam(model.parameters(), lr=1e-2), True)
    got = [step(*data[i]).item() for i in range(3)]
    loss = None
    for i in range(3, 9):
        previous, loss = loss, step(*data[i % len(data)])
        if previous is not None:
            got.append(previous.item())
        del previous
    got.append(loss.item())
    assert not copies
    del loss
    kept = [step(*data[i % len(data)]) for i in range(9, 13)]  # each held on: 11 and 12 move 9 and 10 out
    assert len(copies) == 2
    assert got + [k.item() for k in kept] == eager


def test_a_function_that_switches_a_modules_mode_is_traced_every_call(dev):
    """A module called in two modes within one call (the function's own eval()/train(),
    Python a replay would not repeat) never matches a kept graph: each call runs its
    Python, as an eager call does."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))

    @ggrad.compile
    def f(x):
        a = model(x)
        model.eval()
        b = model(x)
        model.train()
        return a.sum() + b.sum()
    x = np.ones((2, 3), np.float32)
    for _ in range(3):
        f(x)
    assert f.traces == 3 and model.training


def test_a_copy_of_a_returned_loss_holds_its_value_across_later_calls(dev):
    """copy.copy of a result counts as a holder: the next replays do not write over it."""
    import copy
    data = batches()
    eager = run_both(lambda p: Adam(p, lr=1e-2), steps=6, data=data)[0][0]
    model = mlp()
    step = train_step(model, Adam(model.parameters(), lr=1e-2), True)
    kept = []
    for i in range(6):
        kept.append(copy.copy(step(*data[i % len(data)])))  # the result itself dropped at once
    assert [k.item() for k in kept] == eager


def test_big_endian_batches_replay_as_eager_converts_them(dev):
    """'>f2' is float32 to ggrad.tensor ('<f2' is float16): a replay keys on byte order too."""
    @ggrad.compile
    def f(x):
        return x * 3
    x = np.random.default_rng(0).standard_normal((3, 4))
    little, big = x.astype("<f2"), x.astype(">f2")
    assert f(little).dtype is ggrad.float16
    got, want = f(big), ggrad.tensor(big) * 3
    assert got.dtype is want.dtype is ggrad.float32
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert f.captured == 2


@pytest.mark.parametrize("stable", [False, True])
def test_an_output_past_the_stable_copy_limit_gets_its_own_buffer_each_call(dev, monkeypatch, stable):
    """With stable addresses, outputs over STABLE_COPY_BYTES are not given a fixed buffer (it
    would be held and never written): they are written where they will be returned."""
    monkeypatch.setattr(ggrad.capture, "STABLE_ADDRESS_KINDS",
                        frozenset({ggrad.runtime.current().backend.info.kind} if stable else ()))
    monkeypatch.setattr(ggrad.capture, "STABLE_COPY_BYTES", 64)

    @ggrad.compile
    def f(x):
        return x * 2, (x * 3).sum()
    xs = [np.full((4, 8), float(i), np.float32) for i in range(4)]
    results = [f(x) for x in xs]
    capture = next(iter(f._captures.values()))[0]
    assert [w is not None for w in capture.written] == ([False, True] if stable else [])
    for x, (big, total) in zip(xs, results):
        np.testing.assert_array_equal(big.numpy(), x * 2)
        assert total.item() == (x * 3).sum()


def test_a_results_copy_limit_counts_its_stored_bytes_as_an_arguments_does(dev, monkeypatch):
    """A bool is stored in 4 bytes: under stable addresses a bool result over the copy limit
    as stored gets no fixed buffers, as it would not be copied in as an argument (passed back,
    it would be bound where the graph writes its result)."""
    monkeypatch.setattr(ggrad.capture, "STABLE_ADDRESS_KINDS", frozenset({ggrad.runtime.current().backend.info.kind}))
    monkeypatch.setattr(ggrad.capture, "STABLE_COPY_BYTES", 64)

    @ggrad.compile
    def f(x):
        return x > 0, (x * 2).sum()
    xs = [np.full((4, 8), i - 1.5, np.float32) for i in range(4)]  # 32 values: 32 bytes as bools, 128 stored
    results = [f(x) for x in xs]
    capture = next(iter(f._captures.values()))[0]
    assert [w is not None for w in capture.written] == [False, True]
    for x, (positive, total) in zip(xs, results):
        np.testing.assert_array_equal(positive.numpy(), x > 0)
        assert total.item() == (x * 2).sum()


def test_a_host_batch_costs_one_upload_and_reading_the_loss_one_download(dev):
    """x and y go up in one copy (the capture's batch buffer holds both), with their bytes:
    both arrays' values reach the graph (the loss equals the eager step's)."""
    model, opt, step, data = warmed_up()
    x, y = data[3]
    with ggrad.count_transfers() as counts:
        loss = step(x, y)
        value = loss.item()
    assert counts.dispatches == 1
    host_memory = ggrad.runtime.current().backend.host_memory  # cpu: copies are not crossings
    assert counts.crossings == (0 if host_memory else 2)  # x and y up together, the loss down
    assert counts.bytes_up >= (0 if host_memory else x.nbytes + y.size * 4)
    eager_step = warmed_up(compiled=False)[2]
    assert value == eager_step(x, y).item()


def test_numpy_arguments_of_several_types_go_up_in_one_copy_and_each_reaches_its_graph(dev):
    """Three numpy arguments (float32, int64 indices, bool) share one batch buffer at aligned
    offsets: every call uploads once, and each graph reads each argument's own new values
    (a slot left at the trace's buffer, or an offset off by one argument, would repeat the
    first call's values or mix them up)."""
    rng = np.random.default_rng(3)
    w = ggrad.param(rng.standard_normal((7, 3)).astype(np.float32))

    def f(x, idx, keep):
        picked = x[idx]  # rows of x by idx
        return ((picked * keep.float()) @ w.T).sum(), x.mean()

    compiled = ggrad.compile(f)
    host_memory = ggrad.runtime.current().backend.host_memory
    for i in range(5):
        x = rng.standard_normal((6, 3)).astype(np.float32)
        idx = rng.integers(0, 6, 4)
        keep = rng.random((4, 3)) < 0.5
        with ggrad.count_transfers() as counts:
            got = [t.numpy() for t in compiled(x, idx, keep)]
        expected = [t.numpy() for t in f(*(ggrad.tensor(a) for a in (x, idx, keep)))]
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
        if i >= 2:  # replays
            assert counts.uploads == (0 if host_memory else 1)
    assert compiled.traces <= 2


def test_the_captures_of_one_function_share_the_arrays_their_batches_wait_in(dev):
    """Each phase of an accumulation is a capture of its own; the batch of each argument
    waits in one host array for all of them."""
    model = mlp()
    step = train_step(model, Adam(model.parameters(), lr=1e-2, accumulate_steps=2), True)
    data = batches()
    for i in range(6):
        step(*data[i % len(data)])
    captures = [c for variants in step._captures.values() for c in variants]
    assert len(captures) == 2
    first, second = ([u.staged for u in c.uploads] for c in captures)
    assert len(first) == 2 and all(a is b for a, b in zip(first, second)) and first[0] is not first[1]


def test_earlier_results_keep_their_values(dev):
    (eager, *_), (compiled, *_) = run_both(OPTIMIZERS["adam"])
    assert len(set(compiled)) == len(compiled)  # every call returned its own loss
    assert compiled == eager


def test_train_and_eval_modes_are_separate_captures(dev):
    data = batches()
    results = []
    for compiled in (False, True):
        ggrad.manual_seed(5)
        model = nn.Sequential(nn.Linear(12, 16), nn.Dropout(0.5), nn.Linear(16, 5))
        opt = SGD(model.parameters(), lr=0.1)
        step = train_step(model, opt, compiled)
        out = []
        for i in range(9):
            model.train(i % 3 != 2)
            out.append(step(*data[i % len(data)]).item())
        results.append(out)
    assert results[0] == results[1]
    assert step.captured == 2


def test_an_out_of_range_class_in_a_later_batch_is_refused_before_anything_runs(dev):
    model, opt, step, data = warmed_up()
    assert step.captured == 1
    before = [p.numpy() for p in model.parameters()]
    x, y = data[0]
    with pytest.raises(IndexError, match="out of range"):
        step(x, np.full_like(y, SIZES[-1]))
    assert opt._micro_steps == 3
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)


@pytest.mark.parametrize("bad", [2**31, 2**32 + 1, -2**31 - 1])
def test_a_class_beyond_int32_in_a_later_batch_is_refused_not_wrapped(dev, bad):
    """A replay converts an int64 batch into int32 storage: a value past int32 (2**32 + 1
    would wrap to the valid class 1) raises as ggrad.tensor does, before anything runs."""
    model, opt, step, data = warmed_up()
    before = [p.numpy() for p in model.parameters()]
    x, y = data[0]
    with pytest.raises(ValueError, match="out of range"):
        step(x, np.where(np.arange(len(y)) == 3, bad, y))
    assert opt._micro_steps == 3 and step.captured == 1
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)


@pytest.mark.parametrize("kind", ["u1", "i2", ">i8", "<i4"])
def test_class_targets_of_any_width_and_byte_order_are_checked_at_each_replay(dev, kind):
    """A replay tells a batch of classes in range by the greatest of its values read as
    unsigned (negatives wrap to the top) where its byte order is the machine's: each width
    trains as the eager step does, and a class past the last, or -1, still raises."""
    data = [(x, y.astype(kind)) for x, y in batches(4)]
    (eager, *_), (compiled, _, _, step) = run_both(lambda p: SGD(p, lr=0.1), steps=6, data=data)
    assert step.captured == 1 and compiled == eager
    x, y = data[0]
    bad = [SIZES[-1], 255] + ([-1] if np.dtype(kind).kind == "i" else [])
    for value in bad:
        with pytest.raises(IndexError, match="class index out of range"):
            step(x, np.where(np.arange(len(y)) == 5, value, y).astype(kind))
    assert step.captured == 1


def test_ignored_targets_in_replayed_batches_pass_their_check_and_are_ignored(dev):
    """A batch holding ignore_index (outside [0, classes): the replay's extremes say no, so
    the check itself runs and lets it through) trains as the eager step does; a class
    out of range beside it still raises."""
    rng = np.random.default_rng(5)
    data = [(rng.standard_normal((8, SIZES[0])).astype(np.float32),
             np.where(rng.random(8) < 0.3, -100, rng.integers(0, SIZES[-1], 8))) for _ in range(3)]
    (eager, *_), (compiled, _, _, step) = run_both(lambda p: SGD(p, lr=0.1), steps=5, data=data)
    assert step.captured == 1 and compiled == eager
    x, y = data[0]
    with pytest.raises(IndexError, match="class index out of range"):
        step(x, np.where(y == -100, SIZES[-1], y))


def test_replayed_batches_are_converted_as_ggrad_tensor_converts_them(dev):
    """float64 batches, strided views and int32 targets: each replay computes what the
    eager step computes from the same arrays (rounded to float32 as astype rounds)."""
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((2 * 8, SIZES[0]))[::2], rng.integers(0, SIZES[-1], 8).astype(np.int32))
            for _ in range(4)]
    losses = []
    for compiled in (False, True):
        model = mlp()
        step = train_step(model, SGD(model.parameters(), lr=0.1), compiled)
        losses.append([step(*data[i % 4]).item() for i in range(6)])
    assert step.captured == 1 and step.traces == 1
    assert losses[0] == losses[1]


def test_bad_indices_in_tensor_batches_are_refused_on_replay_too(dev):
    """Batches as host tensors (as DataLoader yields them), an embedding and class targets."""
    ggrad.manual_seed(0)
    table = nn.Embedding(10, 4)
    head = nn.Linear(4, 3)
    opt = SGD([*table.parameters(), *head.parameters()], lr=0.1)

    @ggrad.compile
    def step(ids, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(head(table(ids)), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    ids, y = np.arange(6) % 10, np.arange(6) % 3
    for _ in range(3):
        step(ggrad.tensor(ids), ggrad.tensor(y))
    assert step.captured == 1
    with pytest.raises(IndexError, match="gather index out of range"):
        step(ggrad.tensor(ids + 5), ggrad.tensor(y))
    with pytest.raises(IndexError, match="class index out of range"):
        step(ggrad.tensor(ids), ggrad.tensor(y + 1))
    assert np.isfinite(step(ggrad.tensor(ids), ggrad.tensor(y)).item())


def test_calling_a_compiled_function_inside_a_tape_is_an_error():
    @ggrad.compile
    def double(x):
        return x * 2

    with ggrad.grad_tape(), pytest.raises(RuntimeError, match="inside a grad_tape"):
        double(np.ones(3, np.float32))


def test_a_value_read_inside_the_step_is_not_captured_and_says_why(dev):
    model = mlp()
    opt = Adam(model.parameters(), lr=1e-2)
    seen = []

    def step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        seen.append(loss.item())
        opt.step()
        opt.zero_grad()

    compiled = ggrad.compile(step)
    with pytest.warns(RuntimeWarning, match="values on the host"):
        for x, y in batches(4):
            compiled(x, y)
    assert compiled.captured == 0
    assert "values on the host" in compiled.reason
    assert len(seen) == 4  # every call ran the Python


def test_a_tensor_kept_outside_the_step_is_not_captured(dev):
    model = mlp()
    kept = []

    @ggrad.compile
    def forward(x):
        with ggrad.no_grad():
            h = model(x)
        kept.append(h * 2)
        return h

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for x, _ in batches(4):
            out = forward(x)
    assert forward.captured == 0 and "kept outside" in forward.reason
    np.testing.assert_allclose(kept[-1].numpy(), 2 * out.numpy())


def test_replacing_a_weight_makes_the_next_call_trace_again(dev):
    model = nn.Linear(4, 2)

    @ggrad.compile
    def forward(x):
        with ggrad.no_grad():
            return model(x)

    x = np.ones((3, 4), np.float32)
    for _ in range(3):
        forward(x)
    assert forward.captured == 1
    model.weight = ggrad.param(np.full((2, 4), 2.0, np.float32))
    np.testing.assert_allclose(forward(x).numpy(), 8.0 + model.bias.numpy()[None, :] * np.ones((3, 1)))


def test_loading_optimizer_state_makes_the_next_call_trace_again(dev):
    model, opt, step, data = warmed_up()
    saved = opt.state_dict()
    weights = [p.numpy() for p in model.parameters()]
    for i in range(3):
        step(*data[i])
    opt.load_state_dict(saved)
    model.load_state_dict(dict(zip(model.state_dict(), weights)))
    again = [step(*data[i]).item() for i in range(3)]

    model2 = mlp()
    opt2 = Adam(model2.parameters(), lr=1e-2)
    eager = train_step(model2, opt2, False)
    reference = [eager(*data[i]).item() for i in range(3)] + [eager(*data[i]).item() for i in range(3)]
    assert again == reference[3:]


def test_a_device_switch_moves_the_state_and_the_step_carries_on(dev):
    model, opt, step, data = warmed_up(4, fused=True)
    other = "vulkan:0" if dev == "cpu" and "vulkan:0" in [d.name for d in ggrad.devices()] else "cpu"
    with ggrad.device(other):
        losses = [step(*data[i]).item() for i in range(4, 6)]
    assert all(np.isfinite(losses))
    assert opt._micro_steps == 6


def test_bad_arguments_and_results_are_clear_errors():
    @ggrad.compile
    def takes_a_model(model):
        return None

    with pytest.raises(TypeError, match="cannot be passed"):
        takes_a_model(nn.Linear(2, 2))

    @ggrad.compile
    def returns_a_float(x):
        return 1.5

    with pytest.raises(TypeError, match="returned a float"):
        returns_a_float(np.ones(2, np.float32))
    with pytest.raises(TypeError, match="needs a function"):
        ggrad.compile(3)


# ---- found in review: each compares a compiled run with the same run without compile ----
def both(make_step, calls, seed=1):
    """Run `calls(step, model, opt)` eagerly and compiled; returns both results and steps."""
    out = []
    for compiled in (False, True):
        model = mlp(seed)
        opt = Adam(model.parameters(), lr=1e-2)
        fn = make_step(model, opt)
        step = ggrad.compile(fn) if compiled else fn
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = calls(step, model, opt)
        out.append((result, [p.numpy() for p in model.parameters()], step))
    (r_e, p_e, _), (r_c, p_c, step) = out
    assert r_c == r_e
    for a, b in zip(p_e, p_c):
        np.testing.assert_array_equal(a, b)
    return step


def test_gradients_accumulated_over_calls_by_hand_are_not_replayed_stale(dev):
    def make(model, opt):
        def step(x, y, apply):
            with ggrad.grad_tape():
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            if apply:
                opt.step()
                opt.zero_grad()
            return loss
        return step
    data = batches()
    step = both(make, lambda s, m, o: [s(*data[i % 6], apply=i % 2 == 1).item() for i in range(10)])
    assert "gradient set before the call" in step.reason


def test_reading_an_argument_on_the_host_is_not_captured(dev):
    def make(model, opt):
        def step(x, y):
            keep = ggrad.tensor((np.asarray(y) != 0).astype(np.float32))  # Python sees this batch
            with ggrad.grad_tape():
                loss = (F.cross_entropy(model(x), y, reduction="none") * keep).sum()
                loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step
    data = batches()
    step = both(make, lambda s, m, o: [s(*data[i % 6]).item() for i in range(8)])
    assert step.captured == 0 and "on the host" in step.reason


def test_aliased_arguments_and_closures_are_kept_apart(dev):
    w = ggrad.tensor(np.full(4, 10.0, np.float32))
    minus = ggrad.compile(lambda a, b: a - b)
    times_w = ggrad.compile(lambda v: v * w)
    x = ggrad.tensor(np.ones(4, np.float32))
    a, b = ggrad.tensor(np.full(4, 5.0, np.float32)), ggrad.tensor(np.full(4, 2.0, np.float32))
    minus(x, x)
    times_w(w)
    for _ in range(2):
        np.testing.assert_array_equal(minus(a, b).numpy(), 3.0)
        np.testing.assert_array_equal(times_w(a).numpy(), 50.0)
    assert minus.captured == 1 and times_w.captured == 1


def test_a_returned_argument_is_that_call_s_argument(dev):
    w = ggrad.tensor(np.ones((2, 3), np.float32))
    f = ggrad.compile(lambda x: ((x @ w.T).sum(), x))
    for make in (lambda v: np.full((4, 3), v, np.float32), lambda v: ggrad.tensor(np.full((4, 3), v, np.float32))):
        outs = [f(make(float(v))) for v in range(3)]
        assert [float(x.numpy()[0, 0]) for _, x in outs] == [0.0, 1.0, 2.0]
        assert [s.item() for s, _ in outs] == [0.0, 24.0, 48.0]


def test_freezing_a_layer_between_calls_is_seen(dev):
    def make(model, opt):
        def step(x, y):
            with ggrad.grad_tape():
                F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return step

    def calls(step, model, opt):
        data = batches()
        for i in range(8):
            if i == 4:
                for p in model[0].parameters():
                    p.requires_grad_(False)
            step(*data[i % 6])
    both(make, calls)


def test_a_failed_replay_changes_no_optimizer_state(dev):
    model = mlp()
    opt = Adam(model.parameters(), lr=1e-2, accumulate_steps=2)
    step = train_step(model, opt, True)
    data = batches()
    for i in range(4):
        step(ggrad.tensor(data[i][0]), data[i][1])
    before = [p.numpy() for p in model.parameters()]
    handle = ggrad.runtime.to_device(np.asarray(data[0][0], np.float32))  # a raw pass-scope handle
    dead = ggrad.Tensor._wrap(ggrad.lazy.Node(handle.shape, ggrad.float32, handle=handle, scope="pass"))
    ggrad.runtime.reset_pass()  # the pool reset under it: the replay's input is dead
    with pytest.raises(RuntimeError, match="dead handle"):
        step(dead, data[0][1])
    assert opt._micro_steps == 4
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters()))


def test_returning_one_tensor_twice_is_captured(dev):
    def make(model, opt):
        def step(x, y):
            with ggrad.grad_tape():
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
            return loss, {"again": loss}
        return step
    data = batches()
    step = both(make, lambda s, m, o: [(a.item(), b["again"].item()) for a, b in (s(*data[i % 6]) for i in range(6))])
    assert step.captured == 1


def test_static_arguments_keep_a_bounded_number_of_graphs():
    f = ggrad.compile(lambda x, k: x * float(k))
    x = np.ones(3, np.float32)
    for k in range(40):
        np.testing.assert_array_equal(f(x, k).numpy(), float(k))
    assert f.captured <= 16


def test_hooks_added_or_removed_after_compiling_are_seen(dev):
    """A replay repeats the hooks its trace ran: a hook registered later must make the next
    call trace again (as torch.compile's guards do), and so must removing one."""
    model = mlp()
    forward = ggrad.compile(lambda x: model(x))
    x = ggrad.tensor(batches()[0][0])
    plain = forward(x).numpy()
    forward(x)
    assert forward.captured == 1 and forward.traces == 1
    handles = [model[0].register_forward_hook(lambda m, args, out: out * 2.0),
               model[2].register_forward_pre_hook(lambda m, args: (args[0] + 1.0,))]
    hooked = forward(x).numpy()
    np.testing.assert_array_equal(hooked, model(x).numpy())  # as the eager call with the hooks
    assert not np.allclose(hooked, plain)
    forward(x)
    ggrad.realize()
    with ggrad.count_transfers() as t:  # the new capture replays, resident
        forward(x)
        ggrad.realize()
    assert t.crossings == 0 and t.dispatches == 1, t
    assert forward.traces == 2
    handles[0].remove()
    np.testing.assert_array_equal(forward(x).numpy(), model(x).numpy())
    handles[1].remove()
    np.testing.assert_array_equal(forward(x).numpy(), plain)
    assert forward.traces == 4


def test_a_hook_added_and_removed_inside_the_step_is_traced_once(dev):
    model = mlp()

    def shifted(x):
        with model[0].register_forward_hook(lambda m, args, out: out + 1.0):
            return model(x)
    forward = ggrad.compile(shifted)
    x = ggrad.tensor(batches()[0][0])
    results = [forward(x).numpy() for _ in range(4)]
    assert forward.traces == 1 and forward.captured == 1
    for r in results:
        np.testing.assert_array_equal(r, shifted(x).numpy())


def test_a_micro_step_called_twice_per_iteration_is_refused_and_accumulates_as_eager(dev):
    """nanoGPT's loop: a compiled micro-step (tape and backward, no optimizer) called twice
    per iteration, then opt.step() and zero_grad() outside. The second call adds into a
    .grad set by the first: a replay would add into the traced call's buffer, which
    zero_grad() takes away from the parameter."""
    data = batches(8)
    runs = []
    for compiled in (False, True):
        model = mlp()
        opt = Adam(model.parameters(), lr=1e-2)

        def micro(x, y):
            with ggrad.grad_tape():
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            return loss
        step = ggrad.compile(micro) if compiled else micro
        losses, grads = [], []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(4):
                for k in range(2):
                    losses.append(step(*data[2 * i + k]).item())
                grads.append([None if p.grad is None else p.grad.numpy() for p in model.parameters()])
                opt.step()
                opt.zero_grad()
        runs.append((losses, grads, [p.numpy() for p in model.parameters()], step, caught))
    (losses_e, grads_e, params_e, _, _), (losses_c, grads_c, params_c, step, caught) = runs
    assert losses_c == losses_e
    for eager, comp in zip(grads_e, grads_c):
        assert all(g is not None for g in comp)
        for a, b in zip(eager, comp):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(params_e, params_c):
        np.testing.assert_array_equal(a, b)
    assert step.captured == 0 and "gradient set before the call" in step.reason
    assert any("not captured" in str(w.message) for w in caught)


def test_compile_of_a_model_returns_the_model_and_its_step_still_trains():
    """`model = ggrad.compile(model)` (a ported torch.compile call) returns the model
    itself: its forward runs inside the step's grad tape as before, and the step,
    compiled, trains it as the eager loop does."""
    x = ggrad.tensor(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    results = []
    for compiled in (False, True):
        ggrad.manual_seed(0)
        model = ggrad.nn.Linear(3, 2)
        if compiled:
            assert ggrad.compile(model) is model
        opt = ggrad.optim.SGD(model.parameters(), lr=0.1)

        def step(x):
            with ggrad.grad_tape():
                loss = (model(x) ** 2).mean()
                loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        run = ggrad.compile(step) if compiled else step
        results.append([run(x).item() for _ in range(4)])
    assert results[0] == results[1]


def accumulating_iteration(model, opt, micro_steps: int, compiled: bool):
    """A whole iteration of gradient accumulation: `micro_steps` tapes, each adding its
    share of the loss's gradient, then one optimizer step."""
    def iteration(xs, ys):
        total = 0
        for i in range(micro_steps):
            with ggrad.grad_tape():
                loss = F.cross_entropy(model(xs[i]), ys[i]) / micro_steps
                loss.backward()
            total = total + loss.detach()
        opt.step()
        opt.zero_grad()
        return total
    return ggrad.compile(iteration) if compiled else iteration


def test_a_whole_iteration_of_micro_steps_is_captured_and_equals_eager(dev):
    """nanoGPT's accumulation loop compiled as one function: its tapes become one graph,
    replayed as one dispatch, bit for bit the eager loop's losses and weights."""
    k, rng = 3, np.random.default_rng(5)
    data = [(rng.standard_normal((k, BATCH, SIZES[0])).astype(np.float32),
             rng.integers(0, SIZES[-1], (k, BATCH))) for _ in range(5)]
    runs = []
    for compiled in (False, True):
        model = mlp()
        opt = Adam(model.parameters(), lr=1e-2)
        iteration = accumulating_iteration(model, opt, k, compiled)
        losses = [iteration(*data[i % len(data)]).item() for i in range(4)]
        device_data = [(ggrad.tensor(x), ggrad.tensor(y)) for x, y in data]
        for x, y in device_data:
            x.handle, y.handle  # noqa: B018
        with ggrad.count_transfers() as counts:
            for i in range(4, 8):
                iteration(*device_data[i % len(data)])
        losses.append(iteration(*data[0]).item())
        runs.append((losses, [p.numpy() for p in model.parameters()], iteration, counts))
    (losses_e, params_e, _, _), (losses_c, params_c, iteration, counts) = runs
    assert iteration.reason is None and iteration.traces == 2 and iteration.captured == 2  # host and device batches
    assert losses_c == losses_e
    for i, (a, b) in enumerate(zip(params_e, params_c)):
        np.testing.assert_array_equal(a, b, err_msg=f"parameter {i}")
    assert counts.dispatches == 4 and counts.crossings == 0  # one graph a call, the tracing one's included


def test_captured_micro_steps_reuse_one_micro_step_s_scratch_memory(dev):
    """The captured iteration computes micro-step after micro-step: its scratch memory is
    one micro-step's activations (plus the running gradients), not one per micro-step."""
    scratch, kept = {}, []  # kept: a compiled function that dies frees its graphs
    for k in (1, 2, 4):
        model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4))
        opt = SGD(model.parameters(), lr=0.1)
        rng = np.random.default_rng(k)
        xs = rng.standard_normal((k, 512, 32)).astype(np.float32)
        ys = rng.integers(0, 4, (k, 512))
        iteration = accumulating_iteration(model, opt, k, True)
        kept.append(iteration)
        before = ggrad.runtime.memory()["scratch_bytes"]
        iteration(xs, ys)
        assert iteration.captured == 1, iteration.reason
        scratch[k] = ggrad.runtime.memory()["scratch_bytes"] - before
    assert max(scratch[2], scratch[4]) < 1.5 * scratch[1]
