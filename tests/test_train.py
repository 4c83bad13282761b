"""DataLoader, fit and its callbacks, the digits run, the demo and info commands."""

import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad import runtime as rt
from ggrad.optim import Adam

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def digits():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return train_test_split(x, d.target, test_size=0.2, random_state=0, stratify=d.target)


def test_data_loader_batches_shuffles_and_stays_flat(dev):
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    loader = ggrad.DataLoader(x, y, batch_size=4)
    batches = list(loader)
    assert len(loader) == len(batches) == 3 and batches[-1][0].shape == (2, 2)
    assert len(ggrad.DataLoader(x, y, batch_size=4, drop_last=True)) == 2
    first = [b[1].numpy() for b in ggrad.DataLoader(x, y, batch_size=5, shuffle=True, seed=1)]
    again = [b[1].numpy() for b in ggrad.DataLoader(x, y, batch_size=5, shuffle=True, seed=1)]
    assert all((a == b).all() for a, b in zip(first, again))
    assert sorted(np.concatenate(first)) == list(range(10))
    W = ggrad.param(np.ones((2, 3)))
    sizes = []
    for _ in range(30):
        for xb, _ in ggrad.DataLoader(x, y, batch_size=4, shuffle=True):
            (xb @ W).sum().item()
        sizes.append(rt.memory()["persistent_bytes"])
    assert sizes[5] == sizes[-1]
    with pytest.raises(ValueError, match="differ in length"):
        ggrad.DataLoader(x, y[:3])


def test_fit_reaches_the_accuracy_bar_on_digits(tmp_path):
    x_train, x_test, y_train, y_test = digits()
    ggrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    ckpt = tmp_path / "best.safetensors"
    history = ggrad.fit(model, F.cross_entropy, Adam(model.parameters(), lr=3e-3),
                        ggrad.DataLoader(x_train, y_train, batch_size=32, shuffle=True, seed=0),
                        epochs=12, val_data=(x_test, y_test), metrics=("loss", "accuracy"),
                        callbacks=[ggrad.ModelCheckpoint(ckpt, monitor="val_accuracy", mode="max")],
                        verbose=0)
    assert max(history["val_accuracy"]) >= 0.96
    assert history["loss"][-1] < history["loss"][0]
    best = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    best.load_state_dict(ggrad.load(ckpt))
    acc = ggrad.evaluate(best, F.cross_entropy, (x_test, y_test), metrics=("accuracy",))["accuracy"]
    assert acc == pytest.approx(max(history["val_accuracy"]))
    png = history.plot(tmp_path / "curve.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_fit_steps_cross_nothing_but_the_metric_reads(dev):
    x = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    loader = ggrad.DataLoader(x, y, batch_size=16)
    opt = Adam(model.parameters(), lr=1e-2)
    # state made, weights and the metrics' constants uploaded
    ggrad.fit(model, F.cross_entropy, opt, loader, epochs=1, metrics=("loss", "accuracy"), verbose=0)
    with ggrad.count_transfers() as t:
        ggrad.fit(model, F.cross_entropy, opt, loader, epochs=2, metrics=("loss", "accuracy"), verbose=0)
    crossing = dev != "cpu"
    # each fresh batch (x, y), and the two running sums' zeros once per fit call
    assert t.uploads == (2 * 4 * 2 + 2 if crossing else 0)
    assert t.downloads == (2 * 2 if crossing else 0)  # loss and accuracy, once per epoch
    assert t.dispatches <= 2 * 4 + 2  # one per step, and the sums' reset per epoch


def test_early_stopping_restores_the_best_weights():
    x = np.random.default_rng(1).standard_normal((32, 3)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 2, 32)
    model = nn.Sequential(nn.Linear(3, 2))
    stop = ggrad.EarlyStopping(monitor="loss", patience=1, mode="max")  # loss falls: stops at once
    history = ggrad.fit(model, F.cross_entropy, Adam(model.parameters(), lr=1e-2), (x, y), epochs=20,
                        callbacks=[stop], verbose=0)
    assert len(history.epochs) == 2 and stop.stopped_epoch == 2


def test_csv_logger_writes_each_epoch_as_history_has_it(tmp_path):
    """One row per epoch, the History's values, flushed as written; append continues the
    file under its header."""
    import csv
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((48, 3)).astype(np.float32), rng.integers(0, 2, 48)
    model = nn.Sequential(nn.Linear(3, 2))
    path = tmp_path / "log.csv"
    opt = Adam(model.parameters(), lr=1e-2)
    history = ggrad.fit(model, F.cross_entropy, opt, (x, y), epochs=3, val_data=(x[:16], y[:16]),
                        callbacks=[ggrad.CSVLogger(path)], metrics=("loss", "accuracy"), verbose=0)
    more = ggrad.fit(model, F.cross_entropy, opt, (x, y), epochs=2, val_data=(x[:16], y[:16]),
                     callbacks=[ggrad.CSVLogger(path, append=True)], metrics=("loss", "accuracy"), verbose=0)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["epoch", *history.history] and len(rows) == 1 + 3 + 2
    for row, epoch, source in zip(rows[1:], [*history.epochs, *more.epochs], [history] * 3 + [more] * 2):
        i = source.epochs.index(epoch)
        assert [float(v) for v in row[1:]] == pytest.approx([source.history[k][i] for k in rows[0][1:]], rel=1e-12)


def test_fit_rejects_bad_arguments():
    model = nn.Sequential(nn.Linear(2, 2))
    opt = Adam(model.parameters())
    data = (np.ones((4, 2), np.float32), np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="epochs"):
        ggrad.fit(model, F.cross_entropy, opt, data, epochs=0)
    with pytest.raises(ValueError, match="unknown metrics"):
        ggrad.fit(model, F.cross_entropy, opt, data, epochs=1, metrics=("f1",))


def run(args, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, **env})


def test_info_command():
    proc = run(["-m", "ggrad", "info"])
    assert proc.returncode == 0 and "cpu" in proc.stdout and "ggml-python 0.0.45" in proc.stdout
    vulkan = [d.name for d in ggrad.devices() if d.kind == "vulkan"]
    assert proc.stdout.count("matrix cores: ") == len(vulkan)  # one line per Vulkan device


def test_the_vulkan_build_carries_the_cooperative_matrix_shaders():
    """Issue 29: bootstrap.sh builds ggml-vulkan with a glslc that knows the cooperative-
    matrix extensions, so a GPU with matrix cores uses them (lavapipe reports none)."""
    from ggrad.runtime import backend
    features = backend.vulkan_shader_features()
    if features is None:
        pytest.skip("this ggml build has no Vulkan backend")
    assert {"KHR_coopmat", "NV_coopmat2"} <= set(features)
    for device in (d.name for d in ggrad.devices() if d.kind == "vulkan"):
        assert backend.vulkan_traits(device)["matrix cores"] in ("none", "KHR_coopmat", "NV_coopmat2", "NV_coopmat2v")


def test_demo_command_exits_zero(tmp_path):
    proc = run(["examples/digits.py", "--epochs", "3", "--device", "cpu", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test accuracy" in proc.stdout and "reloaded checkpoint" in proc.stdout
    assert (tmp_path / "curve.png").exists() and (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_the_language_model_example_trains_and_samples(arch):
    proc = run(["examples/char_lm.py", "--steps", "40", "--device", "cpu", "--arch", arch])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(line.split("loss")[1].split()[0]) for line in proc.stdout.splitlines() if line.startswith("step")]
    assert losses[-1] < losses[0] - 0.5  # compiled steps keep training
    assert "sample:" in proc.stdout


def test_fit_replays_its_step_after_the_first_calls(fit_steps):
    """fit's step goes through ggrad.compile: after the first calls (optimizer state made,
    then captured) every full batch and every last partial batch is a replay."""
    x = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 2))
    ggrad.fit(model, F.cross_entropy, Adam(model.parameters(), lr=1e-2), (x, y), epochs=4, batch_size=16,
              metrics=("loss", "accuracy"), verbose=0)
    step = fit_steps[0]
    assert step.captured == 2 and step.reason is None  # 16 rows, and the last 4
    assert step.traces <= 4, step.traces  # of 4 epochs x 7 batches


def test_the_cnn_example_reaches_its_accuracy():
    proc = run(["examples/cnn_digits.py", "--epochs", "8", "--device", "cpu"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    accuracy = float(proc.stdout.split("test accuracy")[1].split(";")[0])
    assert accuracy >= 0.97, proc.stdout


def test_the_resnet_example_learns_its_synthetic_cifar():
    """ResNet-18's layout (BasicBlocks, batch norm, stride-2 shortcuts) at a small width on
    512 CIFAR-shaped images: far above chance (0.1) after four epochs on the CPU."""
    proc = run(["examples/resnet_cifar.py", "--width", "8", "--train", "512", "--epochs", "4", "--batch", "64",
                "--device", "cpu"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    accuracy = float(proc.stdout.split("test accuracy")[1])
    assert accuracy >= 0.4, proc.stdout
