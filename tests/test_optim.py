"""Optimizers on the device: equal to float64 formulas written from PyTorch's documented
algorithms, in place, resident, and free of host<->device crossings."""

import contextlib
import math

import numpy as np
import pytest

import ggrad
import ggrad.functional as F
from ggrad import runtime as rt
from ggrad.runtime import backend, kernels
from conftest import run_in_child

# an unpatched ggml's AdamW kernel forms 1 - beta2 in float32: v's increment 1.3e-5 off for
# beta2 = 0.999; the kernel patched by scripts/patch_ggml_adamw.py is exact
LOOSE_KERNEL = not backend.adamw_exact()
from ggrad.optim import SGD, Adam, AdamW, clip_grad_norm_, clip_grad_value_, lr_scheduler

rng = np.random.default_rng(11)
P0 = rng.standard_normal((3, 5))
GRADS = [rng.standard_normal((3, 5)) for _ in range(4)]


# ---- float64 references (PyTorch's documented algorithms) -----------------------------------
def adam_ref(p, grads, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
             decoupled=False):
    p = p.astype(np.float64).copy()
    m, v, v_max = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    rates = lr if isinstance(lr, (list, tuple)) else [lr] * len(grads)
    for t, (g, lr) in enumerate(zip(grads, rates), start=1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        v_max = np.maximum(v_max, v)
        second = v_max if amsgrad else v
        denom = np.sqrt(second) / math.sqrt(1 - b2 ** t) + eps
        p = p - lr / (1 - b1 ** t) * m / denom
    return p, m, v


def sgd_ref(p, grads, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
    p = p.astype(np.float64).copy()
    buf = None
    for g in grads:
        g = g + weight_decay * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def run(opt_class, grads, p0=P0, params_groups=False, **kwargs):
    p = ggrad.param(p0)
    opt = opt_class([{"params": [p]}] if params_groups else [p], **kwargs)
    for g in grads:
        p.grad = g
        opt.step()
    return p, opt


OPTIMIZERS = {
    "adam": (Adam, dict(lr=0.01), lambda g: adam_ref(P0, g, lr=0.01)[0]),
    "adam_l2": (Adam, dict(lr=0.01, weight_decay=0.1), lambda g: adam_ref(P0, g, lr=0.01, weight_decay=0.1)[0]),
    "adam_betas_eps": (Adam, dict(lr=0.02, betas=(0.8, 0.99), eps=1e-3),
                       lambda g: adam_ref(P0, g, lr=0.02, betas=(0.8, 0.99), eps=1e-3)[0]),
    "amsgrad": (Adam, dict(lr=0.01, amsgrad=True), lambda g: adam_ref(P0, g, lr=0.01, amsgrad=True)[0]),
    "adamw": (AdamW, dict(lr=0.01, weight_decay=0.1),
              lambda g: adam_ref(P0, g, lr=0.01, weight_decay=0.1, decoupled=True)[0]),
    "adam_fused": (Adam, dict(lr=0.01, fused=True), lambda g: adam_ref(P0, g, lr=0.01)[0]),
    "adamw_fused": (AdamW, dict(lr=0.01, weight_decay=0.1, fused=True),
                    lambda g: adam_ref(P0, g, lr=0.01, weight_decay=0.1, decoupled=True)[0]),
    "adam_fused_l2_groups": (Adam, dict(params_groups=True, lr=0.1, weight_decay=0.05, fused=True),
                             lambda g: adam_ref(P0, g, lr=0.1, weight_decay=0.05)[0]),
    "sgd": (SGD, dict(lr=0.1), lambda g: sgd_ref(P0, g, 0.1)),
    "sgd_momentum": (SGD, dict(lr=0.1, momentum=0.9, dampening=0.1),
                     lambda g: sgd_ref(P0, g, 0.1, momentum=0.9, dampening=0.1)),
    "sgd_nesterov_wd": (SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
                        lambda g: sgd_ref(P0, g, 0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_device_step_equals_float64_formula(name, dev):
    cls, kwargs, ref = OPTIMIZERS[name]
    p, _ = run(cls, GRADS, **kwargs)
    tol = dict(rtol=5e-5, atol=3e-6) if kwargs.get("fused") and LOOSE_KERNEL else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.numpy(), ref(GRADS), **tol)


@pytest.mark.parametrize("fused", [True, False])
def test_adam_moments_equal_formula_and_live_in_the_persistent_pool(dev, fused):
    p, opt = run(Adam, GRADS, lr=0.01, fused=fused)
    _, m, v = adam_ref(P0, GRADS, lr=0.01)
    state = opt.state[p]
    assert state["step"] == 4
    np.testing.assert_allclose(state["m"].numpy(), m, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(state["v"].numpy(), v, rtol=2e-5 if fused and LOOSE_KERNEL else 1e-5, atol=1e-10)
    assert state["m"].handle.scope == "persistent" and state["v"].handle.scope == "persistent"


@pytest.mark.parametrize("graph", ["concat", "transpose"])
def test_adam_steps_on_gradients_that_are_strided_copies(dev, graph):
    """A gradient built as a copy of a strided view (a concat's slice, a transpose's
    permute), kept as .grad and read by Adam's in-place update in the same graph: the update
    must read the contiguous copy (ggml asserts on a strided operand there: a change that
    handed it the view killed the process)."""
    import torch
    rng = np.random.default_rng(7)
    a0, b0 = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 7)).astype(np.float32)
    k = rng.standard_normal((3, 12) if graph == "concat" else (5, 3)).astype(np.float32)

    def loss(module, a, b, k):
        return (module.cat([a, b], 1) * k).sum() if graph == "concat" else (a.T * k).sum() + b.sum()
    a, b = ggrad.param(a0), ggrad.param(b0)
    opt = Adam([a, b], lr=0.1)
    ta, tb = torch.tensor(a0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    topt = torch.optim.Adam([ta, tb], lr=0.1)
    for _ in range(2):
        with ggrad.grad_tape():
            loss(F, a, b, ggrad.tensor(k)).backward()
        opt.step()  # no zero_grad: .grad stays a kept value of the step's graph (gradients accumulate)
        loss(torch, ta, tb, torch.tensor(k)).backward()
        topt.step()
    np.testing.assert_allclose(a.numpy(), ta.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_parameter_groups_use_their_own_hyperparameters(dev):
    a, b = ggrad.param(P0), ggrad.param(P0 * 2)
    opt = Adam([{"params": [a]}, {"params": [b], "lr": 0.1, "weight_decay": 0.05}], lr=0.01)
    for g in GRADS:
        a.grad, b.grad = g, g
        opt.step()
    np.testing.assert_allclose(a.numpy(), adam_ref(P0, GRADS, lr=0.01)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), adam_ref(P0 * 2, GRADS, lr=0.1, weight_decay=0.05)[0], rtol=1e-5, atol=1e-6)


def test_duplicate_parameters_as_torch():
    """torch raises for a parameter in two groups; within one group it warns (and would
    update it twice: ggrad keeps it once)."""
    a, b = ggrad.param(P0), ggrad.param(P0)
    with pytest.raises(ValueError, match="more than one parameter group"):
        Adam([{"params": [a]}, {"params": [b, a]}])
    opt = SGD([{"params": [a]}], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    with pytest.warns(UserWarning, match="duplicate parameters"):
        opt = SGD([a, b, a], lr=1.0)
    assert [len(g["params"]) for g in opt.param_groups] == [2]
    a.grad = np.ones_like(P0)
    opt.step()
    np.testing.assert_allclose(a.numpy(), P0 - 1.0)  # updated once


def test_params_as_a_dict(dev):
    p = ggrad.param(P0)
    opt = SGD({"w": p}, lr=0.1)
    p.grad = GRADS[0]
    opt.step()
    np.testing.assert_allclose(p.numpy(), P0 - 0.1 * GRADS[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kept", [False, True], ids=["recorded", "kept"])
@pytest.mark.parametrize("fused", [False, True])
def test_steps_are_in_place_in_one_dispatch_and_resident(dev, fused, kept):
    """Gradients still pending: the step is recorded into their graph; computed ones: it
    runs at once as its kept graph, replayed from the second step on. Either way one
    dispatch, in place, nothing crossed, and the values of the update (checked against
    the float64 reference)."""
    p, q = ggrad.param(P0), ggrad.param(P0.T)
    opt = Adam([p, q], lr=0.01, fused=fused)
    here = rt.current().backend
    hyper_in_place = backend.adamw_exact() and kernels.supported(here, kernels.ADAM_HYPER) and \
        kernels.variant(here, "adam_hyper_in_place")
    grads = [GRADS[i % 4] for i in range(11)]
    p.grad, q.grad = grads[0], grads[0].T
    opt.step()
    ggrad.realize()
    ptrs = (p.handle.ptr, q.handle.ptr)
    memory = rt.memory()["persistent_bytes"]
    for i in range(1, 11):
        p.grad, q.grad = grads[i], grads[i].T
        ggrad.realize(p.grad, q.grad)
        if not kept:  # computed in the step's graph
            p.grad, q.grad = p.grad * 1.0, q.grad * 1.0
        with ggrad.count_transfers() as t:
            opt.step()
            if fused and not kept:  # the group's parameters are one recorded kernel effect (after its constants')
                assert [e.op for e in ggrad.lazy.local.effects] == ["adamw"] if not hyper_in_place else \
                    ["adam_hyper_in_place", "adamw"]
            assert ggrad.lazy.has_pending_work() is not kept
            ggrad.realize()
        assert (t.dispatches, t.crossings) == (1, 0)  # both parameters, one graph, nothing crossed
        if i == 6:
            assert (p.handle.ptr, q.handle.ptr) == ptrs
    assert opt._kept_step.compiled.traces == 1  # the first step (host gradients) traced it; the rest replayed or recorded
    np.testing.assert_allclose(p.numpy(), adam_ref(P0, grads, lr=0.01)[0], rtol=1e-5, atol=1e-6)
    assert p.handle.live and p.handle.scope == "persistent"
    assert all(opt.state[p][k].handle.live for k in ("m", "v"))
    assert opt.resident
    assert rt.memory()["persistent_bytes"] == memory
    assert np.isfinite(p.numpy()).all() and np.isfinite(q.numpy()).all()


KEPT_STEPS = [("Adam", dict(lr=0.01)), ("Adam", dict(lr=0.01, fused=False, amsgrad=True)),
              ("AdamW", dict(lr=0.01, weight_decay=0.1, fused=True)), ("Adam", dict(lr=0.01, accumulate_steps=2)),
              ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)), ("RMSprop", dict(lr=0.01, momentum=0.9, centered=True)),
              ("Adagrad", dict(lr=0.05, lr_decay=0.01)), ("Adadelta", dict()), ("Adamax", dict(lr=0.01)),
              ("NAdam", dict(lr=0.01)), ("RAdam", dict(lr=0.01, betas=(0.9, 0.9)))]


def _assert_same_state(ours: dict, theirs: dict) -> None:
    """Two optimizer state dicts hold the same values, bit for bit."""
    def flat(state):
        if isinstance(state, dict):
            return [(k, x) for key in sorted(state, key=str) for k, x in flat(state[key])]
        if isinstance(state, list):
            return [(k, x) for item in state for k, x in flat(item)]
        return [("", state)]
    a, b = flat(ours), flat(theirs)
    assert len(a) == len(b)
    for (_, x), (_, y) in zip(a, b):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


def _kept_against_recorded(make_optimizer, grads, before_step=None, q_has_grad=None, recorded=()) -> list:
    """The same steps over p and q twice: with each gradient left pending (every step
    recorded into its gradients' graph), then computed (the kept step runs where it can),
    and the two runs' weights and state dicts equal bit for bit. `before_step(i, opt, p, q)`
    changes what Python holds before step i, `q_has_grad(i)` whether q has a gradient then,
    `recorded` the steps whose gradients stay pending in the second run too. Each `.grad`
    after a step is the tensor that was set. Returns each run's (optimizer, steps that ran
    at once)."""
    runs, results = [], []
    for kept in (False, True):
        p, q = ggrad.param(P0), ggrad.param(P0 * 2)
        opt = make_optimizer([p, q])
        ran_at_once = 0
        for i, (gp, gq) in enumerate(grads):
            if before_step is not None:
                before_step(i, opt, p, q)
            p.grad, q.grad = gp, (gq if q_has_grad is None or q_has_grad(i) else None)
            ggrad.realize(*[t.grad for t in (p, q) if t.grad is not None])
            if not kept or i in recorded:
                p.grad = p.grad * 1.0
            given = (p.grad, q.grad)
            opt.step()
            assert all(a is b for a, b in zip((p.grad, q.grad), given))
            ran_at_once += not ggrad.lazy.has_pending_work()
            ggrad.realize()
        runs.append((opt, ran_at_once))
        results.append((p.numpy(), q.numpy(), opt.state_dict()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    _assert_same_state(results[0][2], results[1][2])
    return runs


def _halve_lr_at_the_7th(i, opt, p, q):
    if i == 6:
        opt.param_groups[0]["lr"] *= 0.5


@pytest.mark.parametrize("name,kwargs", KEPT_STEPS)
def test_a_step_over_computed_gradients_runs_its_kept_graph_as_recorded(dev, name, kwargs):
    """With the gradients computed and nothing pending, `step()` runs its kept graph at
    once: over 12 steps (the learning rate halved at the 7th) the weights and every
    state tensor equal those of steps recorded into their gradients' graph, bit for bit,
    and most steps were replays (state made at the first step and RAdam's unrectified
    start are traced again)."""
    grads = np.random.default_rng(8).standard_normal((12, 2) + P0.shape).astype(np.float32)
    cls = getattr(ggrad.optim, name)
    (_, recorded_at_once), (opt, kept_at_once) = _kept_against_recorded(lambda ps: cls(ps, **kwargs), grads,
                                                                        _halve_lr_at_the_7th)
    assert recorded_at_once == 0
    assert kept_at_once >= 6 and opt._kept_step.compiled.traces <= 3, opt._kept_step.compiled.reason


def _replace_momentum(i, opt, p, q):
    if i == 5:
        opt.state[p]["momentum_buffer"] = ggrad.tensor(np.zeros(P0.shape, np.float32))


def _clear_state(i, opt, p, q):
    if i == 5:
        opt.state = {}


def _cycle_betas(i, opt, p, q):
    opt.param_groups[0]["betas"] = [(0.9, 0.999), (0.85, 0.999), (0.8, 0.999)][i % 3]  # CyclicLR's cycle_momentum


CHANGED_BETWEEN_STEPS = {
    "momentum buffer replaced": (SGD, dict(lr=0.1, momentum=0.9), _replace_momentum),
    "state cleared": (SGD, dict(lr=0.1, momentum=0.9), _clear_state),
    "betas cycled, composed Adam": (Adam, dict(lr=0.01, fused=False), _cycle_betas),
    "betas cycled, Adam's kernel": (Adam, dict(lr=0.01, fused=True), _cycle_betas),
    "NAdam's betas cycled": (ggrad.optim.NAdam, dict(lr=0.01), _cycle_betas),
    # q has no gradient for two cycles, then one in a micro-step that does not apply (the 5th,
    # recorded: p's gradient pending), which makes q's accumulator: the applying step after it,
    # without q's gradient, applies q's accumulated one (the kept graph of the 4th did not)
    "accumulated without a new gradient": (Adam, dict(lr=0.01, accumulate_steps=2), None),
}


@pytest.mark.parametrize("case", list(CHANGED_BETWEEN_STEPS))
def test_a_kept_step_follows_what_python_changed_between_steps(dev, case):
    """State replaced by hand, bias corrections remade when the betas cycle, an accumulated
    gradient applied without a new one: the kept step's weights and state equal the
    recorded steps' bit for bit, and each `.grad` is the tensor that was set."""
    cls, kwargs, change = CHANGED_BETWEEN_STEPS[case]
    grads = np.random.default_rng(9).standard_normal((12, 2) + P0.shape).astype(np.float32)
    if change is not None:
        _kept_against_recorded(lambda ps: cls(ps, **kwargs), grads, change)
    else:
        _kept_against_recorded(lambda ps: cls(ps, **kwargs), grads, q_has_grad=lambda i: i == 4 or i >= 6,
                               recorded=(4,))


def test_a_kept_step_stops_tracing_when_each_step_has_other_gradients(dev):
    """Parameters with gradients that change from step to step (a mixture of experts): every
    step would trace a kept graph no replay uses; after three in a row the steps are
    recorded for a while, so 40 steps trace at most 16 times, not 38, and train as torch's."""
    rng = np.random.default_rng(0)
    start = rng.standard_normal((6, 8)).astype(np.float32)
    grads = rng.standard_normal((40, 6, 8)).astype(np.float32)
    ps = [ggrad.param(row) for row in start]
    opt = SGD(ps, lr=0.1)
    weights = start.astype(np.float64)
    for i, step_grads in enumerate(grads):
        for j, (p, g) in enumerate(zip(ps, step_grads)):
            # every parameter at first (their state is made), then the bits of i pick them; torch's
            # SGD leaves a parameter without a gradient alone
            p.grad = g if i < 2 or (i >> j) & 1 else None
            weights[j] -= 0.1 * g if p.grad is not None else 0.0
        ggrad.realize(*[p.grad for p in ps if p.grad is not None])
        opt.step()
    assert opt._kept_step.compiled.traces <= 16, opt._kept_step.compiled.traces
    np.testing.assert_allclose(np.stack([p.numpy() for p in ps]), weights, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:ggrad.compile")  # the steps after the skip are refused (host constants)
def test_a_compiled_step_after_an_eager_one_that_skipped_a_parameter_is_traced_again(dev):
    """A parameter without a gradient in an eager step between replays lags its group's
    step count: its Adam step needs its own bias corrections, so the kept graph (shared
    ones) must not replay (it did: q was 1.7e-3 off the reference, silently)."""
    grads = [g.astype(np.float32) for g in GRADS + GRADS[:2]]
    p, q = ggrad.param(P0), ggrad.param(P0.T)
    opt = Adam([p, q], lr=0.01, fused=True)

    def step(gp, gq):
        p.grad, q.grad = gp, gq
        opt.step()
        opt.zero_grad()
    compiled = ggrad.compile(step)
    for i, g in enumerate(grads):
        if i == 2:
            p.grad, q.grad = g, None
            opt.step()
            opt.zero_grad()
        else:
            compiled(ggrad.tensor(g), ggrad.tensor(g.T))
    np.testing.assert_allclose(p.numpy(), adam_ref(P0, grads, lr=0.01)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(q.numpy(), adam_ref(P0.T, [g.T for i, g in enumerate(grads) if i != 2], lr=0.01)[0],
                               rtol=1e-5, atol=1e-6)


def test_a_kept_step_counts_its_in_place_writes_and_keeps_to_ggrads_own_optimizers(dev):
    """A replayed step advances the parameters' version counts as a recorded one does, so
    a backward through values saved before it still refuses (torch's in-place check);
    a parameter that skipped a step keeps Adam's steps recorded (host constants), as
    right as the recorded ones; an optimizer class written outside ggrad is always
    recorded (its Python may hold state a replay would freeze)."""
    p = ggrad.param(P0)
    opt = SGD([p], lr=0.1)
    for _ in range(3):
        with ggrad.grad_tape():
            loss = (p * p).sum()
        loss.item()
        p.grad = GRADS[0]
        ggrad.realize(p.grad)
        opt.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    assert opt._kept_step.compiled.traces == 1

    p, q = ggrad.param(P0), ggrad.param(P0.T)
    opt = Adam([p, q], lr=0.01, fused=True)
    for i, g in enumerate(GRADS):
        p.grad, q.grad = g, (None if i == 1 else g.T)
        ggrad.realize(*[t.grad for t in (p, q) if t.grad is not None])
        opt.step()
    assert "skipped steps" in opt._kept_step.compiled.reason
    np.testing.assert_allclose(p.numpy(), adam_ref(P0, GRADS, lr=0.01)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(q.numpy(), adam_ref(P0.T, [g.T for i, g in enumerate(GRADS) if i != 1], lr=0.01)[0],
                               rtol=1e-5, atol=1e-6)

    class OwnSGD(SGD):
        pass
    p = ggrad.param(P0)
    opt = OwnSGD([p], lr=0.1)
    p.grad = GRADS[0]
    ggrad.realize(p.grad)
    opt.step()
    assert ggrad.lazy.has_pending_work() and opt._kept_step is False


def test_moments_are_made_on_the_device(dev):
    p = ggrad.param(np.ones((64, 64)))
    opt = Adam([p], lr=0.01)
    p.grad = np.ones((64, 64))
    ggrad.realize(p, p.grad)
    with ggrad.count_transfers() as t:
        opt.step()
        ggrad.realize()
    assert t.bytes_up <= 3 * 4  # the lr and two bias-correction scalars, no 16 KiB zeros
    assert opt.state[p]["m"].handle.scope == "persistent"


def test_changing_lr_costs_one_small_upload(dev):
    p, opt = run(Adam, GRADS[:1], lr=0.01)
    ggrad.realize()
    opt.lr = 0.02
    p.grad = GRADS[1]
    ggrad.realize(p.grad)
    with ggrad.count_transfers() as t:
        opt.step()
        ggrad.realize()
    assert t.uploads == (1 if dev != "cpu" else 0) and t.bytes_up == (4 if dev != "cpu" else 0)


def test_weights_survive_pass_resets(dev):
    W = ggrad.param(rng.standard_normal((4, 8)) * 0.1)
    x = ggrad.tensor(rng.standard_normal((8, 16)))
    y = ggrad.tensor(rng.standard_normal((4, 16)))
    opt = Adam([W], lr=0.05)
    losses = []
    for _ in range(25):
        with ggrad.grad_tape():
            loss = F.mse_loss(W @ x, y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert W.handle.live and np.isfinite(losses[-1]) and losses[-1] < losses[0]


def test_gradient_accumulation_averages_on_the_device(dev):
    p = ggrad.param(P0)
    opt = Adam([p], lr=0.01, accumulate_steps=2)
    for g in GRADS:  # two applied updates
        p.grad = g
        opt.step()
        opt.zero_grad()
    averaged = [(GRADS[0] + GRADS[1]) / 2, (GRADS[2] + GRADS[3]) / 2]
    np.testing.assert_allclose(p.numpy(), adam_ref(P0, averaged, lr=0.01)[0], rtol=1e-5)
    assert opt.state[p]["step"] == 2


def test_gradient_accumulation_sum(dev):
    p = ggrad.param(P0)
    opt = SGD([p], lr=0.1, accumulate_steps=2, average=False)
    p.grad = GRADS[0]
    opt.step()
    np.testing.assert_array_equal(p.numpy(), P0.astype(np.float32))  # nothing applied yet
    p.grad = GRADS[1]
    with ggrad.count_transfers() as t:
        opt.step()
        ggrad.realize()
    assert t.dispatches == 1  # the sum, the update and clearing the accumulator: one graph
    np.testing.assert_allclose(p.numpy(), P0 - 0.1 * (GRADS[0] + GRADS[1]), rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_optimizer_outlives_its_device(fused):
    if "vulkan:0" not in [d.name for d in ggrad.devices()]:
        pytest.skip("no Vulkan device")

    def two_steps(first, second):
        ggrad.set_device(first)
        p = ggrad.param(P0)
        opt = Adam([p], lr=0.01, fused=fused)
        p.grad = GRADS[0]
        opt.step()
        ggrad.set_device(second)  # releases `first` if it differs: state must migrate
        p.grad = GRADS[1]
        opt.step()
        return p.numpy(), opt.state[p]["m"].numpy(), opt.state[p]["v"].numpy()

    moved = two_steps("vulkan", "cpu")
    stayed = two_steps("cpu", "cpu")
    for a, b in zip(moved, stayed):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_clip_grad_norm_equals_formula_without_crossings(dev):
    a, b = ggrad.param(P0), ggrad.param(P0[0])
    a.grad, b.grad = GRADS[0], GRADS[1][0]
    ggrad.realize(a.grad, b.grad)
    with ggrad.count_transfers() as t:
        norm = clip_grad_norm_([a, b], max_norm=1.0)
        ggrad.realize()
    assert t.crossings == 0
    total = math.sqrt((GRADS[0] ** 2).sum() + (GRADS[1][0] ** 2).sum())
    assert norm.item() == pytest.approx(total, rel=1e-5)
    np.testing.assert_allclose(a.grad.numpy(), GRADS[0] / (total + 1e-6), rtol=1e-5)
    clip_grad_value_([a], 0.01)
    np.testing.assert_allclose(a.grad.numpy(), np.clip(GRADS[0] / (total + 1e-6), -0.01, 0.01), rtol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(amsgrad=True), dict(fused=True), dict(momentum=0.9)])
def test_state_dict_round_trip_continues_bit_identically(kwargs):
    cls = SGD if "momentum" in kwargs else Adam
    p, opt = run(cls, GRADS[:2], lr=0.01, **kwargs)
    saved_p, saved = p.numpy(), opt.state_dict()
    assert not any("hyper" in shared for shared in saved["group_state"])  # scratch: made again on load
    q = ggrad.param(saved_p)
    opt2 = cls([q], lr=0.5, **kwargs)
    opt2.load_state_dict(saved)
    assert opt2.lr == 0.01
    for g in GRADS[2:]:
        p.grad, q.grad = g, g
        opt.step()
        opt2.step()
    np.testing.assert_array_equal(q.numpy(), p.numpy())


def test_load_state_dict_checks_every_entry_against_its_parameter(dev):
    """A state whose moment has shape (1,), whose bias correction or group array has the
    wrong size, or whose step or index is not a count is refused before anything
    changes: the optimizer then takes a fresh first step (0.9 from ones for each). Each
    would otherwise reach a ggml assert at the next step, so the cases run in a child."""
    out = run_in_child(r"""
        import copy, sys
        import numpy as np, ggrad
        from ggrad.optim import SGD, Adam

        ggrad.set_device(sys.argv[1])

        def entry(where, key, value):
            def change(saved):
                (saved["state"][0] if where == "state" else saved["group_state"][0])[key] = value
            return change

        def renumber(saved):
            saved["state"] = {5: saved["state"][0]}

        def drop_groups(saved):
            saved["group_state"] = []

        cases = {
            "kernel m (1,)": (Adam, {}, entry("state", "m", np.zeros(1, np.float32))),
            "composed v (1,)": (Adam, dict(fused=False), entry("state", "v", np.zeros(1, np.float32))),
            "amsgrad v_max (1,)": (Adam, dict(amsgrad=True), entry("state", "v_max", np.zeros(1, np.float32))),
            "correction1 (3, 5)": (Adam, dict(fused=False), entry("state", "correction1", np.zeros((3, 5)))),
            "momentum (1,)": (SGD, dict(momentum=0.9), entry("state", "momentum_buffer", np.zeros(1))),
            "m as a list": (Adam, {}, entry("state", "m", [[0.0] * 5] * 3)),
            "m of bools": (Adam, {}, entry("state", "m", np.zeros((3, 5), bool))),
            "constants (3,)": (Adam, {}, entry("group", "constants", np.zeros(3, np.float32))),
            "corrections (1,)": (Adam, {}, entry("group", "corrections", np.zeros(1, np.float32))),
            "unknown group array": (Adam, {}, entry("group", "extra", np.zeros(2, np.float32))),
            "negative step": (Adam, {}, entry("state", "step", -1)),
            "float group step": (Adam, {}, entry("group", "step", 1.5)),
            "parameter 5 of 1": (Adam, {}, renumber),
            "no group states": (Adam, {}, drop_groups),
        }
        for name, (cls, kwargs, change) in cases.items():
            p = ggrad.param(np.ones((3, 5)))
            opt = cls([p], lr=0.1, **kwargs)
            p.grad = np.ones((3, 5))
            opt.step()
            saved = copy.deepcopy(opt.state_dict())
            change(saved)
            q = ggrad.param(np.ones((3, 5)))
            fresh = cls([q], lr=0.1, **kwargs)
            try:
                fresh.load_state_dict(saved)
            except ValueError as e:
                print("refused", name, "|", e)
            else:
                print("accepted", name)
            q.grad = np.ones((3, 5))
            fresh.step()
            print("stepped", name, sorted(set(q.numpy().astype(float).ravel().round(6).tolist())))
    """, dev)
    assert out.count("refused") == 14 and "accepted" not in out, out
    assert out.count("[0.9]") == 14, out


def test_bad_hyperparameters_raise():
    p = ggrad.param(P0)
    for bad in (dict(lr=-1.0), dict(lr=float("nan")), dict(betas=(1.0, 0.9)), dict(eps=-1.0),
                dict(weight_decay=-0.1), dict(accumulate_steps=0)):
        with pytest.raises((ValueError, TypeError)):
            Adam([p], **bad)
    with pytest.raises(ValueError):
        SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="does not require grad"):
        SGD([ggrad.tensor(P0)], lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)
    with pytest.raises(ValueError):
        clip_grad_norm_([p], float("nan"))


# ---- schedulers: PyTorch's formulas ----------------------------------------------------
def lrs(scheduler_factory, n, lr=0.1):
    opt = SGD([ggrad.param(P0)], lr=lr)
    sched = scheduler_factory(opt)
    out = [sched.get_last_lr()[0]]
    for _ in range(n):
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def test_step_lr():
    assert lrs(lambda o: lr_scheduler.StepLR(o, 2, 0.5), 5) == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])


def test_cosine_annealing():
    got = lrs(lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.01), 4)
    want = [0.01 + 0.09 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(5)]
    assert got == pytest.approx(want)


def test_one_cycle_steps_as_far_as_torchs_and_no_further():
    """torch lets a OneCycleLR step total_steps times (one optimizer step each, the last
    lr extrapolated by its annealing) and raises at the next step; ggrad alike."""
    torch = pytest.importorskip("torch")
    ours = lr_scheduler.OneCycleLR(SGD([ggrad.param(np.zeros(1, np.float32))], lr=0.1), max_lr=0.1, total_steps=4)
    p = torch.nn.Parameter(torch.zeros(1))
    theirs = torch.optim.lr_scheduler.OneCycleLR(torch.optim.SGD([p], lr=0.1), max_lr=0.1, total_steps=4)
    for _ in range(4):
        ours.step()
        theirs.optimizer.step()
        theirs.step()
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
    theirs.optimizer.step()
    with pytest.raises(ValueError, match="Tried to step 5 times"):
        theirs.step()
    with pytest.raises(ValueError, match="Tried to step 5 times"):
        ours.step()


def test_cosine_warm_restarts():
    got = lrs(lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2), 7)
    cycle = [(0, 2), (1, 2), (0, 4), (1, 4), (2, 4), (3, 4), (0, 8), (1, 8)]
    assert got == pytest.approx([0.1 * (1 + math.cos(math.pi * t / ti)) / 2 for t, ti in cycle])


def test_one_cycle():
    got = lrs(lambda o: lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=10), 9)
    # PyTorch: warm-up to step pct*total-1 = 2, then cosine down to 1/25/1e4 at step 9
    assert got[0] == pytest.approx(1 / 25) and got[2] == pytest.approx(1.0)
    assert got[1] == pytest.approx(1.0 + (1 / 25 - 1.0) / 2 * (math.cos(math.pi * 0.5) + 1))
    assert got[9] == pytest.approx(1 / 25 / 1e4)
    assert all(b <= a for a, b in zip(got[2:], got[3:]))


def test_linear_warmup_cosine():
    got = lrs(lambda o: lr_scheduler.LinearWarmupCosine(o, warmup_steps=4, total_steps=8), 8)
    assert got[:4] == pytest.approx([0.025, 0.04375, 0.0625, 0.08125])
    assert got[4] == pytest.approx(0.1) and got[8] == pytest.approx(0.0, abs=1e-12)


class _Halving:
    """A schedule function with state, as torch's state dicts keep them."""

    def __init__(self):
        self.calls = 0

    def __call__(self, epoch):
        self.calls += 1
        return 0.5 ** (epoch // 3)


TORCH_SCHEDULES = {
    "MultiStepLR": ({"milestones": [3, 7, 7, 12], "gamma": 0.5}, {}),
    "ExponentialLR": ({"gamma": 0.9}, {}),
    "ConstantLR": ({"factor": 0.25, "total_iters": 4}, {}),
    "LinearLR": ({"start_factor": 0.2, "end_factor": 0.9, "total_iters": 6}, {}),
    "PolynomialLR": ({"total_iters": 8, "power": 2.0}, {}),
    "LambdaLR": ({}, {"lr_lambda": lambda epoch: 1.0 / (1 + epoch)}),
    "LambdaLR_per_group": ({}, {"lr_lambda": [lambda epoch: 0.9 ** epoch, lambda epoch: 1 + epoch % 3]}),
    "MultiplicativeLR": ({}, {"lr_lambda": lambda epoch: 0.8 if epoch % 2 else 1.1}),
    "StepLR": ({"step_size": 3, "gamma": 0.5}, {}),
    "CosineAnnealingLR": ({"T_max": 6, "eta_min": 0.01}, {}),  # past T_max: torch's recursive form goes on
}


@pytest.mark.parametrize("name", list(TORCH_SCHEDULES))
def test_schedulers_follow_torchs(name):
    """20 steps over two groups of different rates, against torch.optim.lr_scheduler."""
    torch = pytest.importorskip("torch")
    kwargs, functions = TORCH_SCHEDULES[name]
    cls = name.split("_")[0]
    ours = SGD([{"params": [ggrad.param(P0)], "lr": 0.1}, {"params": [ggrad.param(P0)], "lr": 0.03}], lr=0.1)
    theirs = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": 0.1},
                              {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.03}], lr=0.1)
    mine = getattr(lr_scheduler, cls)(ours, **kwargs, **functions)
    reference = getattr(torch.optim.lr_scheduler, cls)(theirs, **kwargs, **functions)
    for _ in range(20):
        assert mine.get_last_lr() == pytest.approx(reference.get_last_lr(), rel=1e-12, abs=1e-15)
        theirs.step()
        mine.step()
        reference.step()


SEQUENCES = {
    "warmup_cosine": ([("LinearLR", {"start_factor": 0.1, "total_iters": 3}), ("CosineAnnealingLR", {"T_max": 10})], [3]),
    "three": ([("ConstantLR", {"factor": 0.5, "total_iters": 2}), ("ExponentialLR", {"gamma": 0.9}),
               ("StepLR", {"step_size": 3, "gamma": 0.5})], [4, 9]),
    "lambdas": ([("LambdaLR", {"lr_lambda": lambda epoch: (epoch + 1) / 5}),
                 ("MultiplicativeLR", {"lr_lambda": lambda epoch: 0.95})], [5]),
    "multiplicative_first": ([("MultiplicativeLR", {"lr_lambda": lambda epoch: 0.9}), ("ExponentialLR", {"gamma": 0.5}),
                              ("MultiplicativeLR", {"lr_lambda": lambda epoch: 1.0 + epoch / 10})], [4, 8]),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_sequential_schedules_follow_torchs(name):
    """SequentialLR over closed-form, per-group and multiplicative schedules, 20 steps of
    two groups, against torch's (which restarts each scheduler at its milestone)."""
    torch = pytest.importorskip("torch")
    parts, milestones = SEQUENCES[name]
    ours = SGD([{"params": [ggrad.param(P0)], "lr": 0.1}, {"params": [ggrad.param(P0)], "lr": 0.03}], lr=0.1)
    theirs = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": 0.1},
                              {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.03}], lr=0.1)
    mine = lr_scheduler.SequentialLR(ours, [getattr(lr_scheduler, c)(ours, **kw) for c, kw in parts], milestones)
    reference = torch.optim.lr_scheduler.SequentialLR(
        theirs, [getattr(torch.optim.lr_scheduler, c)(theirs, **kw) for c, kw in parts], milestones)
    for _ in range(20):
        assert mine.get_last_lr() == pytest.approx(reference.get_last_lr(), rel=1e-12, abs=1e-15)
        theirs.step()
        mine.step()
        reference.step()
    state = mine.state_dict()
    assert [inner["last_epoch"] for inner in state["_schedulers"]] == [s.last_epoch for s in mine._schedulers]
    with pytest.raises(ValueError, match="one more than the number of milestone"):
        lr_scheduler.SequentialLR(ours, [lr_scheduler.ExponentialLR(ours, 0.9)], [3])


CHAINS = {
    "constant_then_exponential": [("ConstantLR", {"factor": 0.1, "total_iters": 2}), ("ExponentialLR", {"gamma": 0.9})],
    "warmup_and_steps": [("LinearLR", {"start_factor": 0.2, "total_iters": 4}), ("StepLR", {"step_size": 3, "gamma": 0.5})],
    "milestones_and_polynomial": [("MultiStepLR", {"milestones": [2, 5, 5]}), ("PolynomialLR", {"total_iters": 8})],
    "cosine_and_exponential": [("CosineAnnealingLR", {"T_max": 5, "eta_min": 0.001}), ("ExponentialLR", {"gamma": 0.95})],
    "lambda_and_multiplicative": [("LambdaLR", {"lr_lambda": lambda epoch: 1 / (1 + epoch)}),
                                  ("MultiplicativeLR", {"lr_lambda": lambda epoch: 0.9})],
}


@pytest.mark.parametrize("chained", [False, True])
@pytest.mark.parametrize("name", list(CHAINS))
def test_schedulers_stepping_one_optimizer_multiply_as_torchs(name, chained):
    """Two schedulers on one optimizer, stepped one after the other or by a
    ChainedScheduler: their factors multiply, as torch's (a ConstantLR warm-up under an
    ExponentialLR decay starts at a tenth of the rate). 15 steps of two groups, equal to
    torch's rates; the chain's state dict lists each scheduler's."""
    torch = pytest.importorskip("torch")
    ours = SGD([{"params": [ggrad.param(P0)], "lr": 0.1}, {"params": [ggrad.param(P0)], "lr": 0.03}], lr=0.1)
    theirs = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": 0.1},
                              {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.03}], lr=0.1)
    mine = [getattr(lr_scheduler, c)(ours, **kw) for c, kw in CHAINS[name]]
    reference = [getattr(torch.optim.lr_scheduler, c)(theirs, **kw) for c, kw in CHAINS[name]]
    if chained:
        mine, reference = [lr_scheduler.ChainedScheduler(mine)], [torch.optim.lr_scheduler.ChainedScheduler(reference)]
    for _ in range(15):
        assert [g["lr"] for g in ours.param_groups] == pytest.approx([g["lr"] for g in theirs.param_groups],
                                                                     rel=1e-14, abs=0)
        theirs.step()
        for a, b in zip(mine, reference):
            a.step()
            b.step()
    if chained:
        state = mine[0].state_dict()
        assert [inner["last_epoch"] for inner in state["_schedulers"]] == [15, 15]
        with pytest.raises(ValueError, match="ReduceLROnPlateau"):
            lr_scheduler.ChainedScheduler([lr_scheduler.ReduceLROnPlateau(ours)])


@pytest.mark.parametrize("kwargs", [dict(mode="triangular"), dict(mode="triangular2", step_size_down=2),
                                    dict(mode="exp_range", gamma=0.9), dict(scale_fn=lambda x: 0.5 ** x),
                                    dict(cycle_momentum=False)])
def test_cyclic_lr_follows_torchs(kwargs):
    """CyclicLR's rates and, cycled the other way, SGD's momentum over 25 steps of two
    groups (per-group base and max rates), against torch's."""
    torch = pytest.importorskip("torch")
    ours = SGD([{"params": [ggrad.param(P0)]}, {"params": [ggrad.param(P0)]}], lr=0.1, momentum=0.9)
    theirs = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]},
                              {"params": [torch.zeros(1, requires_grad=True)]}], lr=0.1, momentum=0.9)
    args = dict(base_lr=[0.01, 0.02], max_lr=0.1, step_size_up=3, **kwargs)
    mine = lr_scheduler.CyclicLR(ours, **args)
    reference = torch.optim.lr_scheduler.CyclicLR(theirs, **args)
    for _ in range(25):
        for key in ("lr", "momentum"):
            assert [g[key] for g in ours.param_groups] == pytest.approx([g[key] for g in theirs.param_groups],
                                                                        rel=1e-14, abs=0), key
        theirs.step()
        mine.step()
        reference.step()
    assert mine.state_dict()["last_epoch"] == 25
    with pytest.raises(ValueError, match="support momentum"):
        lr_scheduler.CyclicLR(ggrad.optim.Adagrad([ggrad.param(P0)]), 0.01, 0.1)


@pytest.mark.parametrize("name,kwargs", [("Adam", {}), ("Adam", {"fused": False}), ("Adam", {"amsgrad": True}),
                                         ("AdamW", {}), ("Adamax", {}), ("NAdam", {})])
def test_adam_family_under_a_cycling_beta1_follows_torchs(dev, name, kwargs):
    """CyclicLR cycles Adam's beta1 (cycle_momentum): the bias corrections are torch's,
    1 - beta1^t with each step's beta1 (kernel and composed forms), so 12 steps end at
    torch's weights."""
    torch = pytest.importorskip("torch")
    grads = np.random.default_rng(9).standard_normal((12,) + P0.shape).astype(np.float32)
    p = ggrad.param(P0)
    w = torch.tensor(P0.astype(np.float32), requires_grad=True)
    opt = getattr(ggrad.optim, name)([p], **kwargs)
    ref = getattr(torch.optim, name)([w], **{k: v for k, v in kwargs.items() if k != "fused"})
    mine = lr_scheduler.CyclicLR(opt, 0.001, 0.01, step_size_up=3, base_momentum=0.5, max_momentum=0.9)
    reference = torch.optim.lr_scheduler.CyclicLR(ref, 0.001, 0.01, step_size_up=3, base_momentum=0.5,
                                                  max_momentum=0.9)
    for g in grads:
        p.grad, w.grad = ggrad.tensor(g), torch.tensor(g)
        opt.step()
        ref.step()
        mine.step()
        reference.step()
    np.testing.assert_allclose(p.numpy(), w.detach().numpy(), rtol=2e-6, atol=1e-7)


def test_lambda_schedules_keep_stateful_functions_in_their_state_dict():
    """As torch's: a plain function is not saved (None), an object's fields are, and a
    resumed schedule goes on where it was."""
    opt = SGD([{"params": [ggrad.param(P0)]}, {"params": [ggrad.param(P0)]}], lr=0.1)
    halving = _Halving()
    sched = lr_scheduler.LambdaLR(opt, [halving, lambda epoch: 1.0])
    for _ in range(5):
        sched.step()
    state = sched.state_dict()
    assert state["lr_lambdas"][1] is None and state["lr_lambdas"][0] == {"calls": halving.calls}
    fresh_fn = _Halving()
    resumed = lr_scheduler.LambdaLR(SGD([{"params": [ggrad.param(P0)]}, {"params": [ggrad.param(P0)]}], lr=0.1),
                                    [fresh_fn, lambda epoch: 1.0])
    resumed.load_state_dict(state)
    assert fresh_fn.calls == halving.calls and resumed.last_epoch == sched.last_epoch == 5
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas"):
        lr_scheduler.LambdaLR(opt, [halving])


def test_reduce_on_plateau():
    opt = SGD([ggrad.param(P0)], lr=0.1)
    sched = lr_scheduler.ReduceLROnPlateau(opt, patience=1, factor=0.5)
    for metric in (1.0, 0.9, 0.95, 0.95, 0.95):
        sched.step(metric)
    assert sched.get_last_lr() == [0.05]


@pytest.mark.parametrize("cls, kwargs", [(SGD, dict(lr=0.1)), (Adam, dict(lr=0.1)), (Adam, dict(lr=0.1, fused=True))])
def test_accumulating_the_same_gradient_twice_equals_one_step(dev, cls, kwargs):
    """The update reads the accumulator before it is cleared (writes run after reads)."""
    def final(k):
        p = ggrad.param(np.array([1.0, 2.0]))
        opt = cls([p], accumulate_steps=k, **kwargs)
        for _ in range(2 * k):
            with ggrad.grad_tape():
                (p * p).sum().backward()
            opt.step()
            opt.zero_grad()
        return p.numpy()
    np.testing.assert_allclose(final(2), final(1), rtol=1e-6)


def test_fused_adam_with_zeroed_grads_kept_and_the_loss_read(dev):
    def run(set_to_none):
        p = ggrad.param(np.array([1.0, 2.0]))
        opt = Adam([p], lr=0.1, fused=True)
        for _ in range(3):
            with ggrad.grad_tape():
                loss = (p * p).sum()
                loss.backward()
            loss.item()
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        return p.numpy()
    kept = run(False)
    np.testing.assert_allclose(kept, run(True), rtol=1e-6)
    p, grads = np.array([1.0, 2.0]), []
    for _ in range(3):  # the float64 loop: gradients of sum(p^2) at each step's weights
        grads.append(2 * p)
        p = adam_ref(np.array([1.0, 2.0]), grads, lr=0.1)[0]
    np.testing.assert_allclose(kept, p, rtol=5e-5 if LOOSE_KERNEL else 1e-5)


def test_an_accumulated_gradient_is_applied_even_without_a_new_one(dev):
    p = ggrad.param(np.array([1.0]))
    opt = SGD([p], lr=0.5, accumulate_steps=2, average=False)
    p.grad = np.array([1.0])
    opt.step()  # accumulated
    p.grad = None
    opt.step()  # applies what was accumulated
    np.testing.assert_allclose(p.numpy(), [0.5])


@pytest.mark.parametrize("fused", [False, True])
def test_adam_state_is_made_on_the_device_at_construction(dev, fused):
    """Moments exist (zeros, persistent pool) before any step, and the optimizer stays
    resident after steps (the learning rate included)."""
    p = ggrad.param(P0)
    opt = Adam([p], lr=0.01, fused=fused, amsgrad=not fused)
    assert opt.resident
    for key in ("m", "v") + (() if fused else ("v_max", "correction1", "correction2")):
        assert np.all(opt.state[p][key].numpy() == 0), key
    assert opt.state[p]["step"] == 0
    p.grad = GRADS[0]
    opt.step()
    opt.lr = 0.02  # written straight into its buffer
    p.grad = GRADS[1]
    opt.step()
    ggrad.realize()
    assert opt.resident
    np.testing.assert_allclose(p.numpy(), adam_ref(P0, GRADS[:2], lr=[0.01, 0.02], amsgrad=not fused)[0],
                               rtol=1e-4 if fused and LOOSE_KERNEL else 1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, kwargs", [(Adam, dict(lr=0.01)), (AdamW, dict(lr=0.01, weight_decay=0.1)),
                                         (Adam, dict(lr=0.01, weight_decay=0.1)),
                                         (Adam, dict(lr=0.05, betas=(0.3, 0.9)))])
def test_default_adam_is_torchs_through_ggmls_kernel(dev, cls, kwargs):
    """Where ggml's AdamW kernel is exact (built by ggrad's bootstrap), the default Adam is
    that kernel, one node per parameter, and its weights follow torch.optim's over 30 steps
    (beta1 = 0.3 takes torch's other lerp branch)."""
    torch = pytest.importorskip("torch")
    if not backend.adamw_exact():
        pytest.skip("this ggml build's AdamW kernel is not the exact one (scripts/patch_ggml_adamw.py)")
    grads = np.random.default_rng(5).standard_normal((30,) + P0.shape).astype(np.float32)
    p = ggrad.param(P0)
    opt = cls([p], **kwargs)
    assert opt._kernel(opt.param_groups[0]) and "correction1" not in opt.state[p]
    w = torch.tensor(P0.astype(np.float32), requires_grad=True)
    ref = getattr(torch.optim, cls.__name__)([w], **kwargs)
    for g in grads:
        p.grad = g
        opt.step()
        w.grad = torch.tensor(g)
        ref.step()
    np.testing.assert_allclose(p.numpy(), w.detach().numpy(), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("saved_kernel, loaded_kernel", [(True, False), (False, True)])
def test_adam_state_moves_between_the_kernel_and_the_composed_update(monkeypatch, saved_kernel, loaded_kernel):
    """A state saved by one Adam form (the exact kernel's shared bias corrections, or the
    composed update's per-parameter ones) and loaded by the other continues torch's run:
    the missing corrections are made for the steps already taken."""
    torch = pytest.importorskip("torch")
    if not backend.adamw_exact():  # an unpatched ggml asserts on the kernel's 9-element form
        pytest.skip("this ggml build's AdamW kernel is not the exact one (scripts/patch_ggml_adamw.py)")
    grads = np.random.default_rng(3).standard_normal((10, 4)).astype(np.float32)
    p0 = np.random.default_rng(4).standard_normal(4).astype(np.float32)
    w = torch.tensor(p0, requires_grad=True)
    ref = torch.optim.Adam([w], lr=0.05)
    for g in grads:
        w.grad = torch.tensor(g)
        ref.step()
    monkeypatch.setattr(backend, "_adamw_exact", [saved_kernel])
    p = ggrad.param(p0)
    opt = Adam([p], lr=0.05)
    for g in grads[:5]:
        p.grad = g
        opt.step()
    saved, weights = opt.state_dict(), p.numpy().copy()
    monkeypatch.setattr(backend, "_adamw_exact", [loaded_kernel])
    q = ggrad.param(weights)
    resumed = Adam([q], lr=0.05)
    resumed.load_state_dict(saved)
    for g in grads[5:]:
        q.grad = g
        resumed.step()
    np.testing.assert_allclose(q.numpy(), w.detach().numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kwargs", [dict(lr=0.01), dict(lr=0.01, momentum=0.9), dict(lr=0.005, centered=True),
                                    dict(lr=0.01, alpha=0.3, centered=True, momentum=0.5, weight_decay=0.1),
                                    dict(lr=0.02, eps=1e-3, weight_decay=0.05)])
def test_rmsprop_follows_torchs(dev, kwargs):
    """torch.optim.RMSprop's weights over 30 steps (alpha = 0.3 takes torch's other lerp
    form), its state dict's keys, and a resident state with no crossing per step."""
    _follows_torch(dev, "RMSprop", kwargs)


TORCH_OPTIMIZERS = {
    "Adagrad": [dict(), dict(lr=0.05, lr_decay=0.01), dict(weight_decay=0.1, initial_accumulator_value=0.5, eps=1e-6)],
    "Adadelta": [dict(), dict(lr=0.5, rho=0.5, weight_decay=0.05)],
    "Adamax": [dict(), dict(lr=0.01, betas=(0.3, 0.9), weight_decay=0.1)],
    "NAdam": [dict(), dict(lr=0.01, betas=(0.5, 0.9), weight_decay=0.1, momentum_decay=0.05),
              dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)],
    "RAdam": [dict(), dict(lr=0.01, betas=(0.5, 0.9), weight_decay=0.1),
              dict(lr=0.01, betas=(0.8, 0.5), weight_decay=0.1, decoupled_weight_decay=True)],
}


@pytest.mark.parametrize("name,kwargs", [(n, k) for n, ks in TORCH_OPTIMIZERS.items() for k in ks])
def test_optimizers_follow_torchs(dev, name, kwargs):
    """Each optimizer's weights follow torch.optim's over 30 steps, with torch's state
    keys, its state resident and no crossing per step."""
    _follows_torch(dev, name, kwargs)


def _follows_torch(dev, name, kwargs):
    torch = pytest.importorskip("torch")
    grads = np.random.default_rng(6).standard_normal((30,) + P0.shape).astype(np.float32)
    p = ggrad.param(P0)
    opt = getattr(ggrad.optim, name)([p], **kwargs)
    w = torch.tensor(P0.astype(np.float32), requires_grad=True)
    ref = getattr(torch.optim, name)([w], **kwargs)
    for i, g in enumerate(grads):
        p.grad = ggrad.tensor(g)
        ggrad.realize(p.grad)
        with ggrad.count_transfers() as moved:
            opt.step()
            ggrad.realize(p)
        assert moved.crossings == 0, i
        w.grad = torch.tensor(g)
        ref.step()
    np.testing.assert_allclose(p.numpy(), w.detach().numpy(), rtol=2e-6, atol=1e-7)
    assert opt.resident
    ours, theirs = opt.state_dict()["state"][0], ref.state_dict()["state"][0]
    assert set(ours) == set(theirs) and ours["step"] == int(theirs["step"]) == 30
    for key in set(ours) - {"step"}:
        np.testing.assert_allclose(ours[key], theirs[key].numpy(), rtol=2e-6, atol=1e-7)


@pytest.mark.filterwarnings("ignore:ggrad.compile")  # RAdam's refused first steps say so
@pytest.mark.parametrize("name,kwargs", [("RMSprop", dict(lr=0.01, momentum=0.9, centered=True)),
                                         ("Adagrad", dict(lr=0.05, lr_decay=0.01)), ("Adadelta", dict()),
                                         ("Adamax", dict(lr=0.01)), ("NAdam", dict(lr=0.01)),
                                         ("RAdam", dict(lr=0.01, betas=(0.9, 0.9)))])
def test_a_compiled_step_of_the_other_optimizers_is_the_eager_one(dev, name, kwargs):
    """Captured once and replayed, the step gives the eager loop's weights bit for bit
    (the device step counts of Adagrad's decay and Adamax's correction advance). RAdam's
    first steps take the unrectified update (rho_t <= 5 until t = 6 at beta2 = 0.9):
    they run eagerly and the first rectified one is captured."""
    grads = np.random.default_rng(7).standard_normal((10,) + P0.shape).astype(np.float32)
    results = []
    for compiled in (False, True):
        p = ggrad.param(P0)
        opt = getattr(ggrad.optim, name)([p], **kwargs)

        def step(g):
            p.grad = g
            opt.step()
            opt.zero_grad()
        run = ggrad.compile(step) if compiled else step
        for g in grads:
            run(ggrad.tensor(g))
        results.append(p.numpy())
        if compiled:
            assert run.captured == 1, run.reason
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_lbfgs_follows_torchs(dev, line_search_fn):
    """LBFGS with torch's closure API on a regularised logistic regression: three steps of
    4 iterations (the line search's too) follow torch's losses, weights and evaluation
    counts; run to convergence, both reach the same minimum."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 5)).astype(np.float32), (rng.random(64) > 0.5).astype(np.float32)
    w0 = (rng.standard_normal((1, 5)) * 0.1).astype(np.float32)

    def run(lib, max_iter, steps):
        F_ = lib.nn.functional
        if lib is torch:
            w, b = torch.tensor(w0, requires_grad=True), torch.zeros(1, requires_grad=True)
            xs, ys = torch.tensor(x), torch.tensor(y)
        else:
            w, b = ggrad.param(w0), ggrad.param(np.zeros(1, np.float32))
            xs, ys = ggrad.tensor(x), ggrad.tensor(y)
        opt = lib.optim.LBFGS([w, b], lr=0.5, max_iter=max_iter, history_size=5, line_search_fn=line_search_fn)

        def closure():
            opt.zero_grad()
            with (ggrad.grad_tape() if lib is ggrad else contextlib.nullcontext()):
                loss = F_.binary_cross_entropy_with_logits((xs @ w.T + b).squeeze(1), ys) + 0.01 * (w * w).sum()
                loss.backward()
            return loss
        losses = [opt.step(closure).item() for _ in range(steps)]
        weights = w.numpy() if lib is ggrad else w.detach().numpy()
        return losses, weights, opt.state[w]["func_evals"]

    ours, theirs = run(ggrad, 4, 3), run(torch, 4, 3)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-6)
    assert ours[2] == theirs[2]
    converged_ours, converged_theirs = run(ggrad, 20, 3), run(torch, 20, 3)
    assert converged_ours[0][-1] == pytest.approx(converged_theirs[0][-1], rel=1e-6)


def test_lbfgs_state_dict_resumes_the_same_run():
    """An LBFGS state dict (torch's keys: the history as lists of arrays) loaded into a
    fresh optimizer continues exactly where the saved one would have."""
    rng = np.random.default_rng(1)
    target = rng.standard_normal(P0.shape).astype(np.float32)

    def make():
        p = ggrad.param(P0)
        opt = ggrad.optim.LBFGS([p], max_iter=3, history_size=4)

        def closure():
            opt.zero_grad()
            with ggrad.grad_tape():
                loss = ((p - ggrad.tensor(target)) ** 4).sum()
                loss.backward()
            return loss
        return p, opt, closure

    p, opt, closure = make()
    opt.step(closure)
    saved = opt.state_dict()
    assert {"d", "t", "old_dirs", "old_stps", "ro", "H_diag", "prev_flat_grad", "prev_loss", "func_evals",
            "n_iter"} <= set(saved["state"][0])
    q, resumed, resumed_closure = make()
    q.assign_(p.numpy())
    resumed.load_state_dict(saved)
    opt.step(closure)
    resumed.step(resumed_closure)
    np.testing.assert_array_equal(q.numpy(), p.numpy())


@pytest.mark.parametrize("name", ["Adam", "NAdam", "RAdam"])
def test_changing_the_betas_mid_run_follows_torchs(dev, name):
    """Both betas changed by hand after 5 steps: the bias corrections follow torch's,
    1 - beta^t with today's betas, so 10 steps end at torch's weights."""
    torch = pytest.importorskip("torch")
    grads = np.random.default_rng(10).standard_normal((10,) + P0.shape).astype(np.float32)
    p, w = ggrad.param(P0), torch.tensor(P0.astype(np.float32), requires_grad=True)
    opt, ref = getattr(ggrad.optim, name)([p], lr=0.01), getattr(torch.optim, name)([w], lr=0.01)
    for i, g in enumerate(grads):
        if i == 5:
            opt.param_groups[0]["betas"] = ref.param_groups[0]["betas"] = (0.8, 0.99)
        p.grad, w.grad = ggrad.tensor(g), torch.tensor(g)
        opt.step()
        ref.step()
    np.testing.assert_allclose(p.numpy(), w.detach().numpy(), rtol=2e-6, atol=1e-7)


def test_lbfgs_refuses_what_torchs_refuses():
    p = ggrad.param(P0)
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        ggrad.optim.LBFGS([p], line_search_fn="armijo")
    with pytest.raises(ValueError, match="parameter groups"):
        ggrad.optim.LBFGS([{"params": [p]}, {"params": [ggrad.param(P0)]}])
