"""`python -m ggrad finetune`: LoRA over a quantized GGUF model on a text file, resumable
bit for bit, with the adapter llama.cpp loads and the loss curve written."""

import difflib
import os

import numpy as np
import pytest

import ggrad
from ggrad import finetune as ft
from ggrad import gguf
from ggrad.__main__ import main
from ggrad.models import Llama, LlamaConfig


@pytest.fixture
def files(tmp_path):
    ggrad.set_device("cpu")
    ggrad.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=259, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=64))
    base = gguf.save_model(model, str(tmp_path / "base.gguf"), dtype="q8_0")
    data = tmp_path / "data.txt"
    data.write_text(open(difflib.__file__, encoding="utf-8").read()[:20000], encoding="utf-8")
    return base, str(data)


def adapter_tensors(path: str) -> dict:
    import gguf as gg

    return {t.name: np.array(t.data) for t in gg.GGUFReader(path).tensors}


def test_an_interrupted_run_resumes_to_the_same_adapter(files, tmp_path, monkeypatch):
    """Stopped at step 13 with checkpoints every 5, the same call carries on from step 10
    and ends with the uninterrupted run's adapter and losses, bit for bit."""
    base, data = files
    kw = dict(steps=20, batch=4, context=32, checkpoint_every=5, progress=False)
    ggrad.manual_seed(1)
    whole = ft.finetune(base, data, str(tmp_path / "whole.gguf"), **kw)
    assert not os.path.exists(str(tmp_path / "whole.gguf") + ".checkpoint")  # a finished run leaves none
    draw = ft.windows

    def interrupted(data, step, *args):
        if step == 13:
            raise KeyboardInterrupt
        return draw(data, step, *args)
    monkeypatch.setattr(ft, "windows", interrupted)
    out = str(tmp_path / "resumed.gguf")
    ggrad.manual_seed(1)
    with pytest.raises(KeyboardInterrupt):
        ft.finetune(base, data, out, **kw)
    assert os.path.exists(out + ".checkpoint") and not os.path.exists(out)
    monkeypatch.setattr(ft, "windows", draw)
    ggrad.manual_seed(2)  # the adapters' fresh initialization is overwritten by the checkpoint's
    resumed = ft.finetune(base, data, out, **kw)
    assert resumed.losses == whole.losses and len(whole.losses) == 20
    # the Q8_0 blocks: 34 bytes per 32 weights of the block's 7 matrices, the table and the
    # output (259 x 32 each)
    matrices = 2 * 32 * 32 + 2 * 16 * 32 + 3 * 32 * 64 + 2 * 259 * 32
    assert whole.memory["quantized blocks"] == matrices // 32 * 34
    assert whole.memory["AdamW moments"] == 2 * 4 * sum(8 * (i + o) for i, o in
                                                       [(32, 32), (32, 16), (32, 16), (32, 32), (32, 64), (64, 32),
                                                        (32, 64)])
    ours, theirs = adapter_tensors(out), adapter_tensors(whole.adapter)
    assert ours.keys() == theirs.keys() and len(ours) == 2 * 7
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    assert np.mean(whole.losses[-5:]) < np.mean(whole.losses[:5])  # it learns the text


def test_the_command_writes_the_adapter_the_curve_and_prints_llama_cpps_command(files, tmp_path, capsys):
    base, data = files
    out = str(tmp_path / "cli.gguf")
    assert main(["finetune", base, data, "--out", out, "--steps", "6", "--batch", "2", "--context", "16",
                 "--rank", "4", "--targets", "wq,wv", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert f"llama-cli -m {base} --lora {out}" in printed and "tokens of" in printed and "quantized blocks" in printed
    assert sorted(adapter_tensors(out)) == sorted(f"blk.0.attn_{m}.weight.lora_{ab}" for m in "qv" for ab in "ab")
    assert os.path.getsize(str(tmp_path / "cli_loss.png")) > 0  # matplotlib is in the test extras


def test_bad_arguments_and_a_foreign_checkpoint_raise_clearly(files, tmp_path):
    base, data = files
    with pytest.raises(ValueError, match="rank must be a positive int"):
        ft.finetune(base, data, str(tmp_path / "a.gguf"), rank=0)
    short = tmp_path / "short.txt"
    short.write_text("tiny", encoding="utf-8")
    with pytest.raises(ValueError, match="fewer than a window"):
        ft.finetune(base, str(short), str(tmp_path / "a.gguf"), context=32, progress=False)
    out = str(tmp_path / "b.gguf")
    kw = dict(steps=10, batch=2, context=16, checkpoint_every=5, progress=False)
    draw = ft.windows

    def interrupted(data, step, *args):
        if step == 7:
            raise KeyboardInterrupt
        return draw(data, step, *args)
    ft.windows = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            ft.finetune(base, data, out, **kw)
    finally:
        ft.windows = draw
    for change in (dict(alpha=8.0), dict(lr=1e-2), dict(seed=3), dict(context=8), dict(rank=4)):
        with pytest.raises(ValueError, match=f"another {next(iter(change))}"):
            ft.finetune(base, data, out, **{**kw, **change})
    other = tmp_path / "other.txt"
    other.write_text(open(data, encoding="utf-8").read()[::-1], encoding="utf-8")
    with pytest.raises(ValueError, match="another data"):
        ft.finetune(base, str(other), out, **kw)
    assert len(ft.finetune(base, data, out, **kw).losses) == 10  # the same command resumes


@pytest.mark.parametrize("arch", ["qwen2", "gemma", "phi3"])
def test_each_architecture_gets_every_projection_adapted(tmp_path, arch):
    """The default targets exist in every architecture (phi3's fused projections included)
    and the adapter names llama.cpp's tensors of that architecture."""
    ggrad.set_device("cpu")
    ggrad.manual_seed(0)
    config = LlamaConfig(vocab_size=259, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=64,
                         arch=arch, tie_embeddings=arch != "phi3")
    base = gguf.save_model(Llama(config), str(tmp_path / "base.gguf"), dtype="q8_0")
    data = tmp_path / "data.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 40, encoding="utf-8")
    result = ft.finetune(base, str(data), str(tmp_path / "a.gguf"), steps=3, batch=2, context=16, progress=False)
    names = {name.rsplit(".weight.", 1)[0] for name in adapter_tensors(result.adapter)}
    expected = {"blk.0.attn_qkv", "blk.0.attn_output", "blk.0.ffn_up", "blk.0.ffn_down"} if arch == "phi3" else \
        {f"blk.0.{n}" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    assert names == expected
