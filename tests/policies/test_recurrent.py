"""Recurrent networks under the built-in policies (docs/policies.md,
"Recurrent networks"): nn.LSTM, torch's nn.GRU and nn.RNN on XLA:CPU,
forward and backward.

- Where a policy lists the module's op in lower precision (read from the
  policy, so a new entry is covered here), the region equals a manual cast
  of the input, the states and the weights: outputs and every gradient bit
  for bit, and the HLO's dots take the region's dtype only.
- Under "cpu" the outputs and gradients have torch.autocast("cpu")'s dtypes
  and close values, but for the one pinned difference (an LSTM with
  projections: c_n).
- An LSTM language model trained once under the cuda rules (float16,
  GradScaler, syncfree.SGD) and checked several ways.
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
import torch_xla
from torch.func import functional_call

import xla_amp
from xla_amp import policies, syncfree

from tests.support import clear_metrics, count, hlo, materialize
from tests.support.conformance import HOST_LIMITS
from tests.support.fp8 import dots

# torch's own GRU: torch_xla 2.9 replaces nn.GRU with its scan GRU, which
# calls no aten::gru (tests/engine/test_upstream_torch_xla_scan_gru.py)
TORCH_GRU = getattr(nn.GRU, "_orig", None) or nn.GRU
MODULES = {
    "lstm-2-layers": lambda: nn.LSTM(3, 4, num_layers=2),
    "lstm-bidirectional-batch-first": lambda: nn.LSTM(3, 4, bidirectional=True,
                                                      batch_first=True),
    "lstm-projections": lambda: nn.LSTM(3, 4, proj_size=2),
    "gru": lambda: TORCH_GRU(3, 4),
    "gru-bidirectional": lambda: nn.GRU(3, 4, bidirectional=True),  # torch_xla: torch's
    "rnn-tanh": lambda: nn.RNN(3, 4),
    "rnn-relu-2-layers": lambda: nn.RNN(3, 4, num_layers=2, nonlinearity="relu"),
}
OPS = {"lstm": "aten::lstm.input", "gru": "aten::gru.input", "rnn-tanh": "aten::rnn_tanh.input",
       "rnn-relu": "aten::rnn_relu.input"}
NAMES = tuple(policies.names())


def _op(module: str) -> str:
    return next(op for prefix, op in OPS.items() if module.startswith(prefix))


def _listed(policy: str, module: str) -> bool:
    return policies.get(policy).category(_op(module)) == "lower_precision_fp"


def _build(module: str, device):
    """The module, its input and its initial states (float32, random)."""
    torch.manual_seed(0)
    m = MODULES[module]().to(device)
    shape = (2, 5, 3) if m.batch_first else (5, 2, 3)
    x = torch.randn(shape).to(device).requires_grad_()
    layers = m.num_layers * (2 if m.bidirectional else 1)
    h = torch.randn(layers, 2, m.proj_size or m.hidden_size).to(device)
    c = torch.randn(layers, 2, m.hidden_size).to(device)
    return m, x, ((h, c) if isinstance(m, nn.LSTM) else h)


def _outputs(out) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _forward_backward(m, x, call):
    """Outputs, then the gradients of the input and of every parameter."""
    outs = _outputs(call())
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs))
    grads = torch.autograd.grad(loss, [x, *m.parameters()])
    return outs, list(grads)


LISTED = [(p, m) for p in NAMES for m in MODULES if _listed(p, m)]


def test_the_rules_list_the_ops_their_systems_cast_whole():
    """cuda: every recurrent op (cuDNN's RNN); cpu: the LSTM alone (oneDNN);
    tpu: none (torch.autocast('xla') has no rule for them)."""
    by_policy = {p: {m for q, m in LISTED if q == p} for p in ("cuda", "cpu", "tpu")}
    assert by_policy["cuda"] == set(MODULES)
    assert by_policy["cpu"] == {m for m in MODULES if m.startswith("lstm")}
    assert by_policy["tpu"] == set()


@pytest.mark.parametrize("policy,module", LISTED, ids=[f"{p}-{m}" for p, m in LISTED])
def test_a_listed_op_runs_as_a_manual_cast(device, policy, module):
    low = policies.get(policy).default_dtype
    m, x, states = _build(module, device)
    with xla_amp.autocast(device, policy=policy):
        got, got_grads = _forward_backward(m, x, lambda: m(x, states))
    kinds = {k for _, kk, _, _ in dots(hlo(*got)) for k in kk}
    materialize(got + got_grads)
    want, want_grads = _forward_backward(m, x, lambda: functional_call(
        m, {k: v.to(low) for k, v in m.named_parameters()},
        (x.to(low), torch.utils._pytree.tree_map(lambda t: t.to(low), states))))
    materialize(want + want_grads)
    assert [t.dtype for t in got] == [low] * len(got)
    assert kinds == {str(low).replace("torch.", "").replace("bfloat", "bf").replace("float", "f")}
    assert [g.dtype for g in got_grads] == [torch.float32] * len(got_grads)
    for a, b in zip(got + got_grads, want + want_grads):
        assert torch.equal(a.cpu(), b.cpu())


def _torch_cpu(module):
    """torch.autocast("cpu")'s outputs and gradients (the same weights)."""
    m, x, states = _build(module, "cpu")  # (a bidirectional nn.GRU is torch's, as on XLA)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return _forward_backward(m, x, lambda: m(x, states))


# (module, output index) -> (this policy's dtype, torch.autocast("cpu")'s)
CPU_DIFFERENCES = {("lstm-projections", 2): (torch.bfloat16, torch.float32)}


@pytest.mark.parametrize("module", MODULES)
def test_cpu_rules_match_torch_cpu_autocast(device, module):
    try:
        want, want_grads = _torch_cpu(module)
    except RuntimeError as e:  # oneDNN's bfloat16 LSTM, on a CPU without AVX-512
        if "aten::lstm.input" in HOST_LIMITS and "primitive descriptor" in str(e):
            pytest.skip(HOST_LIMITS["aten::lstm.input"])
        raise
    m, x, states = _build(module, device)
    with xla_amp.autocast(device, policy="cpu"):
        got, got_grads = _forward_backward(m, x, lambda: m(x, states))
    materialize(got + got_grads)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.dtype, w.dtype) == CPU_DIFFERENCES.get((module, i), (w.dtype, w.dtype))
        torch.testing.assert_close(g.cpu().float(), w.float(), rtol=3e-2, atol=3e-2)
    assert [g.dtype for g in got_grads] == [w.dtype for w in want_grads]
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g.cpu(), w, rtol=5e-2, atol=5e-2)


# ---- a whole model: an LSTM language model under the cuda rules ------------

class _LanguageModel(nn.Module):
    """Embedding, a two-layer LSTM, a decoder (PyTorch's word_language_model
    shape, small)."""

    def __init__(self, vocab=40, width=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2)
        self.decode = nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.decode(self.lstm(self.embed(tokens))[0])


STEPS = 8


@functools.lru_cache(maxsize=1)
def _trained():
    """Trained once: losses, compilations and device->host transfers per step,
    the LSTM's output dtypes, and the model with its batch."""
    device = torch_xla.device()
    torch.manual_seed(0)
    model = _LanguageModel().to(device)
    seen = []
    model.lstm.register_forward_hook(lambda m, i, o: seen.append(
        [t.dtype for t in _outputs(o)]))
    tokens = torch.randint(0, 40, (9, 4)).to(device)      # [time, batch]
    opt = syncfree.SGD(model.parameters(), lr=2.0, momentum=0.9)
    scaler = xla_amp.GradScaler()
    torch_xla.sync()
    losses, compiles, transfers = [], [], []
    for _ in range(STEPS):
        clear_metrics()
        opt.zero_grad()
        with xla_amp.autocast(device, policy="cuda"):
            logits = model(tokens[:-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[1:].flatten())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())
        torch_xla.sync()
        compiles.append(count("CompileTime"))
        transfers.append(count("TransferFromDeviceTime"))
    return dict(losses=[float(l.cpu()) for l in losses], compiles=compiles,
                transfers=transfers, seen=seen, model=model, tokens=tokens)


def test_the_lstm_language_model_learns_in_float16(device):
    run = _trained()
    assert run["seen"] == [[torch.float16] * 3] * STEPS
    assert all(torch.isfinite(p).all() and p.dtype == torch.float32
               for p in run["model"].parameters())
    assert run["losses"][-1] < 0.8 * run["losses"][0], run["losses"]


def test_the_lstm_language_models_steps_are_one_graph_without_syncs(device):
    run = _trained()
    assert run["compiles"][1:] == [0] * (STEPS - 1), run["compiles"]
    assert run["transfers"] == [0] * STEPS, run["transfers"]


def test_the_lstm_language_model_compiled_equals_lazy(device):
    """torch.compile(backend="openxla"): Dynamo runs the LSTM itself eagerly
    (it does not trace RNN modules), the region's rules apply all the same."""
    run = _trained()
    model, tokens = run["model"], run["tokens"][:-1]
    with torch.no_grad(), xla_amp.autocast(device, policy="cuda"):
        lazy = model(tokens)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="openxla")(tokens)
    assert lazy.dtype == compiled.dtype == torch.float16
    assert torch.equal(lazy.cpu(), compiled.cpu())


def test_packed_sequences_of_xla_tensors_fail_without_autocast(device):
    """torch_xla 2.9: pack_padded_sequence's batch sizes are a functional
    wrapper with no storage, and an RNN cannot read them
    (docs/upstream/torch_xla_packed_sequence.md). Fails once upstream fixes
    it: then test packed sequences here."""
    from torch.nn.utils.rnn import pack_padded_sequence
    m, x, _ = _build("lstm-2-layers", device)
    packed = pack_padded_sequence(x.detach(), torch.tensor([5, 3]))
    assert torch._is_functional_tensor(packed.batch_sizes)
    with pytest.raises(RuntimeError, match="data is not allocated"):
        m(packed)
