"""TensorBoard logging: the event files ggrad writes read back, with TensorBoard's own
reader, as the values the run had; drawing the graph changes nothing about training."""

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad.optim import Adam
from ggrad.utils.tensorboard import SummaryWriter


def read(log_dir) -> EventAccumulator:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    return events


def data(seed=3, n=64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 3, n)


def model_with_dropout(seed=0):
    ggrad.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def test_fit_logs_scalars_histograms_and_the_graph_as_the_run_had_them(dev, tmp_path):
    x, y = data()
    model = model_with_dropout()
    opt = Adam(model.parameters(), lr=1e-2)
    board = ggrad.TensorBoard(tmp_path, histogram_freq=2, example_input=x[:4])
    history = ggrad.fit(model, F.cross_entropy, opt, (x, y), epochs=4, val_data=(x[:16], y[:16]),
                        callbacks=[board], metrics=("loss", "accuracy"), batch_size=16, verbose=0)
    events = read(tmp_path)
    assert sorted(events.Tags()["scalars"]) == sorted(history.history)
    for key, values in history.history.items():
        logged = events.Scalars(key)
        assert [e.step for e in logged] == history.epochs
        assert [e.value for e in logged] == [float(np.float32(v)) for v in values]  # stored as float32
    names = [name for name, _ in model.named_parameters()]
    assert sorted(events.Tags()["histograms"]) == sorted(names)
    for name, p in model.named_parameters():
        logged = events.Histograms(name)
        assert [e.step for e in logged] == [2, 4]
        last, weights = logged[-1].histogram_value, p.numpy().astype(np.float64)
        assert (last.num, last.min, last.max) == (weights.size, weights.min(), weights.max())
        assert last.sum == pytest.approx(weights.sum(), rel=1e-12, abs=1e-12)
    graph = {node.name: node for node in events.Graph().node}
    for name, p in model.named_parameters():
        module, _, leaf = name.rpartition(".")
        scoped = f"Sequential/{type(model[int(module)]).__name__}[{module}]/{leaf}"
        assert graph[scoped].op == "Parameter"
        assert [d.size for d in graph[scoped].attr["_output_shapes"].list.shape[0].dim] == list(p.shape)
    for node in graph.values():  # every edge joins two drawn nodes
        assert all(source in graph for source in node.input)
    ops = [node for node in graph.values() if node.op not in ("Parameter", "Buffer", "Input", "Constant")]
    assert any(n.name.startswith("Sequential/Linear[0]/") for n in ops)
    assert any(n.name.startswith("Sequential/ReLU[2]/") for n in ops)
    output = ops[-1]  # the topological order ends at the model's output
    assert output.name.startswith("Sequential/Linear[4]/")
    assert [d.size for d in output.attr["_output_shapes"].list.shape[0].dim] == [4, 3]


def test_drawing_the_graph_draws_no_random_number_and_moves_no_statistic(dev, tmp_path):
    """The graph is recorded in eval mode and never run: a run with the callback trains
    bit for bit as one without it (dropout's draws, batch norm's running statistics)."""
    x, y = data()
    runs = []
    for board in (None, ggrad.TensorBoard(tmp_path, histogram_freq=0, example_input=x[:4])):
        model = model_with_dropout()
        opt = Adam(model.parameters(), lr=1e-2)
        history = ggrad.fit(model, F.cross_entropy, opt, (x, y), epochs=2, batch_size=16, verbose=0,
                            callbacks=[board] if board else [])
        assert model.training
        runs.append((history.history["loss"], {k: v.numpy() for k, v in model.state_dict().items()}))
    assert runs[0][0] == runs[1][0]
    for key, value in runs[0][1].items():
        np.testing.assert_array_equal(value, runs[1][1][key])
    assert read(tmp_path).Tags()["graph"]


def test_summary_writer_takes_ggrad_tensors(dev, tmp_path):
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    with SummaryWriter(tmp_path) as writer:
        writer.add_scalar("loss", ggrad.tensor(np.float32(0.25)) * 3, 7)
        writer.add_scalars("parts", {"a": ggrad.tensor(1.0), "b": 2.0}, 1)
        writer.add_histogram("ggrad", ggrad.tensor(values), 1)
        writer.add_histogram("numpy", values, 1)
        writer.add_histogram("bf16", ggrad.tensor(values).to(ggrad.bfloat16), 1)
    events = read(tmp_path)
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(7, 0.75)]
    ours, theirs = events.Histograms("ggrad")[0].histogram_value, events.Histograms("numpy")[0].histogram_value
    assert ours == theirs
    assert events.Histograms("bf16")[0].histogram_value.num == 1000
    with pytest.raises(ValueError, match="input_to_model"):
        SummaryWriter(tmp_path / "g").add_graph(nn.Linear(2, 2))


def test_the_callback_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="histogram_freq"):
        ggrad.TensorBoard(tmp_path, histogram_freq=-1)
    with pytest.raises(ValueError, match="not both"):
        ggrad.TensorBoard(tmp_path, writer=SummaryWriter(tmp_path))
