"""benchmarks/llm.py without a GPU: its refusals, its reports of paths that
cannot run, and its FLOP count against the model it builds (``make bench``
runs its --smoke, every path on the CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from benchmarks import llm
from tests.support import llama_model as L
from tests.support.launch import ROOT


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path):
    fake = tmp_path / "nvidia-smi"  # a driver tool that finds no GPU
    fake.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}/usr/bin:/bin", OUT=str(tmp_path / "o"))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.llm"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "benchmarks/llm.py: no NVIDIA GPU here (nvidia-smi lists none); "
        "run it on a GPU, or with --smoke for the CPU check"]
    assert not (tmp_path / "o").exists()  # nothing ran, nothing written


def test_a_path_whose_library_is_missing_is_reported_not_run(tmp_path, monkeypatch):
    real = llm.importlib.util.find_spec
    monkeypatch.setattr(llm.importlib.util, "find_spec",
                        lambda name: None if name in ("torchao", "torchax") else real(name))
    assert llm.missing("torchao-fp8") == "not installed: torchao"
    assert llm.missing("xla-fp8") == "not installed: torchax"
    assert llm.missing("compile-bf16") is None
    llm.main(["--smoke", "--paths", "torchao-fp8,xla-bf16", "--out", str(tmp_path)])
    got = json.loads((tmp_path / "llm.json").read_text())
    assert got["paths"] == {"torchao-fp8": {"not_run": "not installed: torchao"},
                            "xla-bf16": {"not_run": "not installed: torchax"}}
    table = (tmp_path / "llm.md").read_text()
    assert "| torchao-fp8 | not installed: torchao |" in table
    assert "MFU = tokens/s x (6 N + 12 L d T" in table


def test_the_flop_count_is_the_models_own_parameters():
    """N in 6 N + 12 L d T: every parameter but the token embedding, of the
    model the benchmark builds (Llama-3-8B's shapes, 8 layers: on the meta
    device, nothing allocated)."""
    for shape, seq in (("8b-8l", 4096), ("smoke", 64)):
        with torch.device("meta"):
            model = L.build(shape, seq)
        s = L.SHAPES[shape]
        embed = model.model.model.embed_tokens.weight.numel()
        n = sum(p.numel() for p in model.parameters()) - embed
        per_token, formula = L.training_flops(shape, seq)
        assert per_token == 6 * n + 12 * s["num_hidden_layers"] * s["hidden_size"] * seq
        assert f"6 x {n:,}" in formula
        if shape == "8b-8l":  # 8 layers of 218.1 M, an embedding and a head of 525.3 M each
            assert (n, embed) == (8 * 218_112_000 + 4096 + 525_336_576, 525_336_576)


def test_mfu_is_model_flops_over_the_named_peak():
    assert llm.peak("NVIDIA H100 80GB HBM3") == (989.0, "H100 dense bf16 989 TFLOP/s")
    assert llm.peak("NVIDIA H200") == (989.0, "H200 dense bf16 989 TFLOP/s")
    assert llm.peak("NVIDIA A10G")[0] is None

    class Args:
        smoke, seq, batch, steps = False, 4096, 2, 100
    results = {"xla-bf16": {"tokens_per_s": 20000.0, "last_loss": 10.0},
               "xla-fp8": {"tokens_per_s": 25000.0, "last_loss": 10.1},
               "torchao-fp8": {"not_run": "not installed: torchao"}}
    meta = llm.summarize(results, Args, "NVIDIA H100 80GB HBM3")
    per_token = L.training_flops("8b-8l", 4096)[0]
    assert results["xla-fp8"]["mfu"] == 25000.0 * per_token / 989e12
    assert abs(results["xla-fp8"]["loss_vs_xla_bf16"] - 0.01) < 1e-12
    assert meta["peak"] == "H100 dense bf16 989 TFLOP/s" and meta["batch"] == 2
    assert "mfu" not in results["torchao-fp8"]
