"""The models and variants of the fp8 GPU benchmarks (benchmarks/fp8_gpu.py,
benchmarks/fp8_profile.py): what each builds, from the same weights and
batches, and the context its steps are traced in. The variants are
described in benchmarks/fp8_gpu.py's docstring."""
from __future__ import annotations

import contextlib

# the fp8 variants' recipes (delayed scaling, the model's kept layers besides)
FAST = {"fp8": {}, "fp8-fast-all": {"fast_accumulation": "all"},
        "fp8-fast-none": {"fast_accumulation": "none"},
        "fp8-bf16-out": {"gemm_output": "bfloat16"}}
# an fp8 variant with an engine default taken out (fp8_gpu's docstring)
UNPINNED, XLA_TRANSPOSES = "-unpinned", "-xla-transposes"
VARIANTS = ("bf16", *FAST, *(v + x for x in (UNPINNED, XLA_TRANSPOSES) for v in FAST))


def base(variant: str) -> str:
    """The recipe's variant name, without the suffix."""
    return variant.removesuffix(UNPINNED).removesuffix(XLA_TRANSPOSES)


FULL = {"mlp": dict(d=4096, hidden=16384, blocks=4, tokens=8192),
        "gpt2": dict(vocab=50257, seq=1024, d=768, heads=12, layers=12, batch=8)}
SMOKE = {"mlp": dict(d=64, hidden=256, blocks=4, tokens=256),
         "gpt2": dict(vocab=512, seq=64, d=64, heads=4, layers=2, batch=4)}
KEEP = {"mlp": (), "gpt2": ("*.c_attn", "*.c_proj")}  # GPT-2: only the MLPs in fp8


def build(model: str, shapes: dict, variant: str, n_batches: int = 4):
    """(module, [(input, target)], loss_fn(output, target)) on the CPU, seed 0;
    the module converted to fp8 for an fp8 variant (delayed scaling, its fast
    accumulation)."""
    net, batches, loss_fn = _build(model, shapes, n_batches)
    if base(variant) in FAST:
        from xla_amp import fp8
        fp8.convert(net, fp8.Fp8Recipe(scaling="delayed", keep=KEEP[model], **FAST[base(variant)]))
    return net, batches, loss_fn


@contextlib.contextmanager
def pinning(variant: str):
    """The context `variant`'s steps are traced in: amaxes pinned (the
    default) unless an ``-unpinned`` variant; on torchax, the fp8 dots'
    operands transposed through words on a GPU (the default) unless an
    ``-xla-transposes`` variant (fp8_gpu's docstring)."""
    from xla_amp.fp8 import _quant
    with contextlib.ExitStack() as stack:
        stack.enter_context(_quant.pinned_amax(not variant.endswith(UNPINNED)))
        if variant.endswith(XLA_TRANSPOSES):
            from xla_amp.torchax import _fp8
            stack.enter_context(_fp8.word_transposes(False))
        yield


def _build(model: str, shapes: dict, n_batches: int):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if model == "mlp":
        class Residual(nn.Module):
            def __init__(self, d, hidden):
                super().__init__()
                self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

            def forward(self, x):
                return x + self.down(F.gelu(self.up(x)))
        d = shapes["d"]
        net = nn.Sequential(*(Residual(d, shapes["hidden"]) for _ in range(shapes["blocks"])))
        teacher = torch.randn(d, d, generator=g) / d ** 0.5
        xs = [torch.randn(shapes["tokens"], d, generator=g) for _ in range(n_batches)]
        return net, [(x, torch.tanh(x @ teacher)) for x in xs], \
            lambda out, y: F.mse_loss(out.float(), y)
    from tests.support.gpt_model import GPT, lm_loss
    net = GPT(shapes["vocab"], shapes["seq"], shapes["d"], shapes["heads"], shapes["layers"],
              tied=True)
    toks = [torch.randint(0, shapes["vocab"], (shapes["batch"], shapes["seq"] + 1), generator=g)
            for _ in range(n_batches)]
    return net, [(t[:, :-1], t[:, 1:]) for t in toks], lambda out, y: lm_loss(out.float(), y)
