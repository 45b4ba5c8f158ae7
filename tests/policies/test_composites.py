"""Composites follow the policy's system (issue #51): under
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
autocast, which needs a GPU: not checked here (docs/policies.md)."""
from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.utils._pytree as pytree

import xla_amp
from tests.support import torchax_paths as paths
from xla_amp.policies import _decompose

# multi-operand calls OpInfo's first samples miss (einsum's is one operand)
EXTRA = {
    "einsum-2": (lambda: [torch.randn(4, 5), torch.randn(5, 6)],
                 lambda a, b: torch.einsum("ij,jk->ik", a, b)),
    "einsum-1": (lambda: [torch.randn(4, 4)], lambda a: torch.einsum("ii->i", a)),
    "tensordot": (lambda: [torch.randn(3, 4, 5), torch.randn(4, 5, 6)],
                  lambda a, b: torch.tensordot(a, b, dims=2)),
    "affine_grid": (lambda: [torch.randn(2, 2, 3)],
                    lambda t: torch.nn.functional.affine_grid(t, [2, 1, 4, 4],
                                                              align_corners=False)),
}


def _floats(out) -> list[str]:
    return [str(t.dtype) for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _cases():
    seen = {}
    for fns in torch.overrides.get_overridable_functions().values():
        for func in fns:
            name = paths.qualname(func)
            if name in seen or name in paths.HAND:
                continue
            info = paths._opinfos().get(func)
            if info is None:
                continue
            for s in paths.samples(info):
                leaves = [s.input, *s.args, *s.kwargs.values()]
                if all(not (isinstance(t, torch.Tensor) and t.is_complex()) for t in leaves):
                    seen[name] = (lambda s=s: ((s.input, *s.args), s.kwargs), info.op)
                    break
    for name, (make, call) in EXTRA.items():
        seen[name] = (lambda make=make: (tuple(make()), {}), call)
    return seen


def _run(call, args, kwargs, device, region):
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    torch.manual_seed(0)
    with region:
        try:
            return _floats(call(*pytree.tree_map(move, list(args)),
                                **pytree.tree_map(move, dict(kwargs))))
        except Exception as e:  # noqa: BLE001 -- compared, not hidden
            return [f"error: {type(e).__name__}"]


@functools.lru_cache(maxsize=1)
def _compare():
    import contextlib
    dev = torch.device("xla:0")
    differ, excused, count = {}, {}, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (make, call) in _cases().items():
            args, kwargs = make()
            want = _run(call, args, kwargs, "cpu", torch.autocast("cpu", dtype=torch.bfloat16))
            if want and want[0].startswith("error"):
                continue  # the CPU cannot run this sample under autocast
            count += 1
            got = _run(call, args, kwargs, dev, xla_amp.autocast(dev, policy="cpu"))
            if got == want:
                continue
            plain_cpu = _run(call, args, kwargs, "cpu", contextlib.nullcontext())
            plain_xla = _run(call, args, kwargs, dev, contextlib.nullcontext())
            (excused if plain_xla != plain_cpu else differ)[name] = (want, got)
    return count, differ, excused


def test_every_public_function_gives_cpu_autocasts_dtypes():
    count, differ, excused = _compare()
    assert count > 700, count
    assert differ == {}, differ
    assert len(excused) < 25, excused  # torch_xla's own differences, a bounded few


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
