"""Composites follow the policy's system: under
torch.autocast("cpu") a composite decomposes and the ops inside it are cast;
torch_xla lowers some composites itself (einsum, affine_grid_generator), and
the cpu policy's [decompose] table makes the engine run PyTorch's
decomposition for them. Checked over every public torch function that has a
sample (torch.overrides' functions; PyTorch's OpInfo samples, and the
multi-operand calls below): the floating dtypes xla_amp.autocast(policy="cpu")
gives on XLA:CPU equal those torch.autocast("cpu") gives on the CPU.

A function is excused only where torch_xla differs from the CPU without any
autocast too (its own dtype or an error: nothing a policy decides), which
the test derives by running it so. The cuda rules' reference is CUDA
autocast, recorded on an NVIDIA GPU by scripts/record_cuda_autocast.py into
cuda_autocast_dtypes.json (its torch and device inside): the same calls
under xla_amp.autocast(policy="cuda") on XLA:CPU give the recorded dtypes,
excused only where torch_xla without autocast differs from the GPU without
autocast; a case list that has moved away from the table fails as stale."""
from __future__ import annotations

import contextlib
import functools
import json
import pathlib
import warnings

import pytest
import torch

import xla_amp
from tests.support import op_samples as S
from xla_amp.policies import _decompose

EXTRA = S.EXTRA
_run = S.run
CUDA_TABLE = pathlib.Path(__file__).with_name("cuda_autocast_dtypes.json")


def _cases():
    return S.composite_cases()


def _live_cpu(name, call, args, kwargs):
    """torch.autocast("cpu")'s dtypes now, and (when asked) the CPU's without it."""
    return (_run(call, args, kwargs, "cpu", torch.autocast("cpu", dtype=torch.bfloat16)),
            lambda: _run(call, args, kwargs, "cpu", contextlib.nullcontext()))


@functools.lru_cache(maxsize=1)
def _cuda_table() -> dict:
    return json.loads(CUDA_TABLE.read_text())


def _recorded_cuda(name, call, args, kwargs):
    """CUDA autocast's recorded dtypes and the GPU's without it; None where the
    table has no such sample (another torch's sample: not comparable)."""
    rec = _cuda_table()["cases"].get(name)
    if rec is None or rec["signature"] != S.signature(args, kwargs):
        return None
    return rec["autocast"], lambda: rec["plain"]


@functools.lru_cache(maxsize=None)
def _compare(policy):
    """(cases compared, {name: (want, got)} differing, excused, [names not
    comparable]) of xla_amp.autocast(policy=) on XLA:CPU against the
    policy's system: `_live_cpu` or `_recorded_cuda`."""
    reference = {"cpu": _live_cpu, "cuda": _recorded_cuda}[policy]
    dev = torch.device("xla:0")
    differ, excused, moved, count = {}, {}, [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (make, call) in _cases().items():
            args, kwargs = make()
            ref = reference(name, call, args, kwargs)
            if ref is None:
                moved.append(name)
                continue
            want, plain_ref = ref
            if want and want[0].startswith("error"):
                continue  # the reference device cannot run this sample under autocast
            count += 1
            got = _run(call, args, kwargs, dev, xla_amp.autocast(dev, policy=policy))
            if got == want:
                continue
            plain_xla = _run(call, args, kwargs, dev, contextlib.nullcontext())
            (excused if plain_xla != plain_ref() else differ)[name] = (want, got)
    return count, differ, excused, moved


def test_every_public_function_gives_cpu_autocasts_dtypes():
    count, differ, excused, _ = _compare("cpu")
    assert count > 700, count
    assert differ == {}, differ
    assert len(excused) < 25, excused  # torch_xla's own differences, a bounded few


def test_every_public_function_gives_cuda_autocasts_dtypes():
    """affine_grid: float16 under CUDA autocast (its generator is a bmm);
    tensordot float32 (CUDA autocast promotes it: measured on an H200)."""
    count, differ, excused, _ = _compare("cuda")
    assert count > 700, count
    assert differ == {}, differ
    assert len(excused) < 25, excused


def test_the_recorded_cuda_table_is_not_stale():
    """Every case this tree's torch samples is in the table with the same
    tensors, but for a bounded few a different torch samples differently
    (recorded: torch 2.11 on the GPU; here 2.9). Rerun
    scripts/record_cuda_autocast.py on an NVIDIA GPU when this fails."""
    recorded = _cuda_table()["recorded"]
    assert recorded["device"] == "cuda" and recorded["autocast_dtype"] == "float16", recorded
    _, _, _, moved = _compare("cuda")
    assert len(moved) <= 0.01 * len(_cases()), (
        f"{len(moved)} cases not in {CUDA_TABLE.name} as sampled here (rerun "
        f"scripts/record_cuda_autocast.py on a GPU): {moved[:20]}")


def test_the_decomposed_composites_are_exercised():
    """einsum of two operands and affine_grid: bfloat16 (cast inside); einsum
    of one operand: float32 (no bmm inside, as on the CPU)."""
    dev = torch.device("xla:0")
    for name, want in (("einsum-2", ["torch.bfloat16"]), ("einsum-1", ["torch.float32"]),
                       ("affine_grid", ["torch.bfloat16"])):
        make, call = EXTRA[name]
        assert _run(call, make(), {}, dev, xla_amp.autocast(dev, policy="cpu")) == want, name
    # gradients flow through the decomposition
    a = torch.randn(4, 5, device=dev, requires_grad=True)
    with xla_amp.autocast(dev, policy="cpu"):
        y = torch.einsum("ij,jk->ik", a, torch.randn(5, 6, device=dev))
    y.float().sum().backward()
    assert a.grad.dtype == torch.float32 and a.grad.shape == (4, 5)


def test_decompose_entries_are_checked_with_file_and_line(tmp_path):
    from xla_amp import policies
    (tmp_path / "t.toml").write_text(
        'name = "t"\ndefault_dtype = "bfloat16"\nsupported_dtypes = ["bfloat16"]\n'
        '[lower_precision_fp]\n"aten::mm" = "x"\n[decompose]\n"aten::mm" = "y"\n')
    with pytest.raises(ValueError, match=r"t\.toml:7: aten::mm has no composite kernel"):
        policies.load(tmp_path / "t.toml")
    (tmp_path / "t.toml").write_text(
        'name = "t"\ndefault_dtype = "bfloat16"\nsupported_dtypes = ["bfloat16"]\n'
        '[lower_precision_fp]\n"aten::einsum" = "x"\n[decompose]\n"aten::einsum" = "y"\n')
    with pytest.raises(ValueError, match=r"t\.toml:7: aten::einsum is both in "
                                         r"\[lower_precision_fp\] and in \[decompose\]"):
        policies.load(tmp_path / "t.toml")
    assert _decompose.composite("aten::einsum") and not _decompose.composite("aten::mm")
    assert policies.get("tpu").adaptation("aten::einsum") is None  # tpu: listed itself
    assert policies.get("cpu").adaptation("aten::einsum") == "decompose"
