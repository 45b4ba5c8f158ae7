"""Activation checkpointing inside xla_amp.autocast (xla_amp/precision/:
_checkpointing.py, _xla_device_module.py): torch.utils.checkpoint runs on XLA
tensors, and every checkpoint implementation recomputes under the region's
policy, so outputs and gradients equal the uncheckpointed run's bit for bit,
dropout masks included.

XLA:CPU's own policy is "cpu"; the regions here force the others, which is where
a recompute under the default policy went wrong. The block holds ops those
policies cast differently: softmax and einsum on bfloat16 inputs (tpu: float32 and
low precision; cpu: neither), LayerNorm, GELU, dropout.
"""
import functools

import pytest
import torch
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.utils.checkpoint as xla_checkpoint
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import xla_amp
from xla_amp import GradScaler, autocast, policies, syncfree

from tests.support import assert_same, clear_metrics, count

# (policy, dtype): every policy's default, and the cuda rules in bfloat16
REGIONS = [("tpu", None), ("cuda", None), ("cuda", torch.bfloat16), ("cpu", None)]
IMPLEMENTATIONS = {
    "torch-reentrant": lambda f, *a: torch_checkpoint(f, *a, use_reentrant=True),
    "torch-non-reentrant": lambda f, *a: torch_checkpoint(f, *a, use_reentrant=False),
    "torch_xla": lambda f, *a: xla_checkpoint.checkpoint(f, *a),
}


GELU_FP32 = policies.get("cpu").with_overrides(name="cpu-gelu-fp32", fp32=["aten::gelu"])


class Block(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.norm = nn.LayerNorm(2 * width)
        self.down = nn.Parameter(torch.randn(width, 2 * width) / 6)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        h = self.up(x)
        h = self.norm(torch.nn.functional.gelu(h)) * torch.softmax(h, -1)
        return torch.einsum("bi,oi->bo", self.drop(h), self.down)


class Net(nn.Module):
    """Two blocks, each run through `wrap` (None: no checkpoint)."""

    def __init__(self, wrap=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.wrap = wrap

    def forward(self, x):
        for block in self.blocks:
            x = block(x) if self.wrap is None else self.wrap(block, x)
        return x


def _run(device, wrap, policy, dtype, region=None, prepare=lambda net: net, buffers=False):
    """Output, input gradient and parameter gradients (and, with `buffers`,
    every buffer) of one forward and backward from fixed weights, input and
    XLA seed; `prepare(net)` -> the model to run (fp8.convert, module rules)."""
    torch.manual_seed(0)
    net = prepare(Net(wrap)).to(device)
    x = torch.randn(4, 16).to(device).requires_grad_()
    xm.set_rng_state(1234, str(device))
    with region or autocast(device, policy=policy, dtype=dtype):
        y = net(x)
    y.float().square().sum().backward()
    torch_xla.sync()
    return [y.cpu(), x.grad.cpu(), *[p.grad.cpu() for p in net.parameters()],
            *([b.cpu() for b in net.buffers()] if buffers else [])]


def test_torch_xla_registers_no_device_module():
    """pytorch/xla#5766 (pinned): torch_xla 2.9 gives torch.utils.checkpoint no
    ``torch.xla`` to find the RNG through, so a checkpoint of XLA tensors raised
    AttributeError. ``torch.xla`` is xla_amp's (it registers one only where none
    exists): once this fails, torch_xla brings its own; drop
    xla_amp/precision/_xla_device_module.py."""
    assert getattr(torch.xla, "__xla_amp__", False)


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("policy,dtype", REGIONS)
def test_recompute_matches_the_uncheckpointed_run(device, implementation, policy, dtype):
    want = _run(device, None, policy, dtype)
    got = _run(device, IMPLEMENTATIONS[implementation], policy, dtype)
    expected = dtype or policies.get(policy).default_dtype
    assert got[0].dtype == want[0].dtype == expected
    assert_same(got, want)


@pytest.mark.parametrize("implementation", ["torch-reentrant", "torch-non-reentrant"])
def test_compiled_checkpoint_matches_the_lazy_uncheckpointed_run(device, implementation):
    """torch.compile(backend="openxla") traces torch.utils.checkpoint as its
    own higher-order op (Dynamo never calls the hooked internals): the region's
    casts are in the trace, and the compiled checkpointed step equals the lazy
    plain one bit for bit (dropout off: compiled code draws other masks)."""
    def run(wrap, compiled):
        torch.manual_seed(0)
        net = Net(wrap).to(device)
        for block in net.blocks:
            block.drop.p = 0.0
        x = torch.randn(4, 16).to(device).requires_grad_()

        def forward(x):
            with autocast(device, policy="cuda"):
                return net(x)
        y = (torch.compile(forward, backend="openxla") if compiled else forward)(x)
        y.float().square().sum().backward()
        torch_xla.sync()
        return [y.cpu(), x.grad.cpu(), *[p.grad.cpu() for p in net.parameters()]]
    want = run(None, False)
    assert want[0].dtype == torch.float16
    assert_same(run(IMPLEMENTATIONS[implementation], True), want)


def test_a_tensor_passed_by_keyword_only_is_recomputed_in_the_region(device):
    """Non-reentrant checkpoints take keyword arguments. With the XLA tensor
    only there, torch's own device inference answers "cuda": it restores
    neither XLA's autocast state nor its seed. The recompute still runs in
    the region (dtypes) and from the forward's seed (dropout masks)."""
    def by_keyword(block, x):
        return torch_checkpoint(lambda *, h: block(h), h=x, use_reentrant=False)
    assert_same(_run(device, by_keyword, "tpu", None), _run(device, None, "tpu", None))


@pytest.mark.parametrize("implementation", ["torch-reentrant", "torch-non-reentrant"])
@pytest.mark.parametrize("scaling", ["delayed", "dynamic"])
def test_fp8_layers_recompute_the_same_quantization(device, implementation, scaling):
    """fp8.convert'ed blocks: the recompute quantizes as the forward did, and
    delayed scaling's pending amaxes (a running max, written again by the
    recompute) end as in the plain run: outputs, gradients and every fp8
    buffer bit-equal."""
    from xla_amp import fp8

    def run(wrap):
        return _run(device, wrap, "tpu", None, buffers=True,
                    prepare=lambda net: fp8.convert(net, fp8.Fp8Recipe(scaling=scaling)))
    want = run(None)
    assert len(want) == 12 + (8 if scaling == "delayed" else 4)  # + the 2 layers' fp8 buffers
    assert_same(run(IMPLEMENTATIONS[implementation]), want)


def test_dropout_draws_differ_without_the_restored_seed(device):
    """The control for the seed: the same block without restoring the RNG
    draws other masks, so the equality above is the seed's doing."""
    want = _run(device, None, "tpu", None)
    no_seed = _run(device, lambda f, *a: torch_checkpoint(f, *a, use_reentrant=True,
                                                           preserve_rng_state=False),
                   "tpu", None)
    assert not torch.equal(no_seed[1], want[1])


def test_a_policy_with_overrides_and_a_disabled_region_are_replayed(device):
    """What the recompute replays is the active compiled policy (a Policy with
    overrides, which no default could give: here the cpu rules with GELU in
    float32, which moves every gradient) and autocast's enabled flag (torch
    restores that one itself: the disabled region is the control that the
    replay does not turn it back on)."""
    wrap = IMPLEMENTATIONS["torch-reentrant"]
    want = _run(device, None, GELU_FP32, None)
    assert not torch.equal(want[1], _run(device, None, "cpu", None)[1])
    assert_same(_run(device, wrap, GELU_FP32, None), want)

    def disabled():
        outer = autocast(device, policy="tpu")

        class Both:
            def __enter__(self):
                outer.__enter__()
                self.inner = autocast(device, enabled=False)
                self.inner.__enter__()

            def __exit__(self, *exc):
                self.inner.__exit__(*exc)
                return outer.__exit__(*exc)
        return Both()
    got = _run(device, wrap, "tpu", None, region=disabled())
    assert got[0].dtype == torch.float32
    assert_same(got, _run(device, None, "tpu", None, region=disabled()))


def test_module_policies_inside_and_around_the_checkpoint(device):
    """A module policy's region inside the checkpointed call (on the Block: its
    hooks run again in the recompute) and around it (on the Net: the recorded
    policy is that region's). Each module policy's rules differ from the tpu
    region's and from XLA:CPU's default, so each run differs from both plain
    regions'."""
    plain = [_run(device, None, policy, None)[1] for policy in ("tpu", "cpu")]
    for target, rules in ((Block, "cpu"), (Net, GELU_FP32)):
        def ruled(net):
            xla_amp.module_policies(net, {target: rules})
            return net
        runs = [_run(device, wrap, "tpu", None, prepare=ruled)
                for wrap in (None, IMPLEMENTATIONS["torch-non-reentrant"])]
        assert not any(torch.equal(runs[0][1], p) for p in plain[:1 if target is Block else 2]), target
        assert_same(runs[1], runs[0])


def test_a_checkpointed_training_step_is_one_graph_without_transfers(device):
    """GradScaler + syncfree.AdamW over checkpointed blocks: the RNG state the
    checkpoint stores and restores is a host value (no transfer), and every
    step after the first is the first one's graph."""
    torch.manual_seed(0)
    net = Net(IMPLEMENTATIONS["torch-non-reentrant"]).to(device)
    opt = syncfree.AdamW(net.parameters(), lr=1e-3)
    scaler = GradScaler(init_scale=2.0 ** 8)
    x = torch.randn(4, 16).to(device)

    def step():
        opt.zero_grad()
        with autocast(device, policy="cuda"):
            loss = net(x).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()

    step()
    step()
    clear_metrics()
    for _ in range(3):
        step()
    xm.wait_device_ops()
    assert count("ExecuteTime") == 3
    assert count("CompileTime") == 0
    assert count("TransferFromDeviceTime") == 0


def test_the_device_module_keeps_the_seed_of_each_device(device):
    """torch.random.fork_rng(device_type="xla") and the device() context use
    ``torch.xla``'s state functions; a state of the wrong size is refused
    before anything changes."""
    xm.set_rng_state(77, "xla:0")
    with torch.random.fork_rng(devices=[0], device_type="xla"):
        xm.set_rng_state(5, "xla:0")
        with torch.xla.device(0):
            assert torch.xla.current_device() == 0
            state = torch.xla.get_rng_state()
    assert xm.get_rng_state("xla:0") == 77
    torch.xla.set_rng_state(state, 0)
    assert xm.get_rng_state("xla:0") == 5
    with pytest.raises(ValueError, match="8-byte state"):
        torch.xla.set_rng_state(torch.zeros(4, dtype=torch.uint8))
    assert xm.get_rng_state("xla:0") == 5
    with pytest.raises(ValueError, match="not an XLA device"):
        torch.xla.get_rng_state("cpu")


def _gpt2_grads(device, policy, checkpointing, dtype=None):
    """Loss and named gradients of Hugging Face GPT-2 (2 layers, random weights,
    dropout on) with and without its own gradient checkpointing, as
    Trainer(gradient_checkpointing=True) enables it (non-reentrant)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32,
                                       vocab_size=128)).to(device).train()
    if checkpointing:
        model.activation_checkpointing_enable()
        assert all(block.gradient_checkpointing for block in model.transformer.h)
    tokens = torch.randint(0, 128, (2, 32)).to(device)
    xm.set_rng_state(99, str(device))
    with autocast(device, policy=policy, dtype=dtype, enabled=policy is not None):
        loss = model(tokens, labels=tokens).loss
    loss.backward()
    torch_xla.sync()
    return {"loss": loss.detach().cpu(),
            **{name: p.grad.cpu() for name, p in model.named_parameters()}}


def _differences(device, policy, dtype=None):
    """{name: max |difference| / max |value|} of the tensors that differ
    between the checkpointed run and the plain one."""
    got = _gpt2_grads(device, policy, True, dtype)
    want = _gpt2_grads(device, policy, False, dtype)
    assert [(k, v.dtype) for k, v in got.items()] == [(k, v.dtype) for k, v in want.items()]
    return {k: ((got[k].double() - want[k].double()).abs().max()
                / want[k].double().abs().max()).item()
            for k in want if not torch.equal(got[k], want[k])}


@functools.lru_cache(maxsize=None)
def _float32_differences(device):
    return _differences(device, None)


def test_transformers_checkpointing_in_float32_differs_at_most_in_reduction_order(device):
    """XLA's own part, without autocast: the recompute makes another graph. With
    XLA:CPU's default backend level, XLA sums the two LayerNorm weight gradients
    over the batch in another order there, one float32 ulp apart; at the
    tests' level 0 nothing differs. Everything else is bit-equal."""
    differences = _float32_differences(device)
    assert set(differences) <= {"transformer.h.0.ln_2.weight", "transformer.h.1.ln_2.weight"}
    assert all(v <= 2 * 2.0 ** -23 for v in differences.values()), differences


@pytest.mark.parametrize("policy,dtype", [("tpu", None), ("cuda", torch.bfloat16), ("cpu", None)])
def test_transformers_gradient_checkpointing_equals_the_plain_run(device, policy, dtype):
    """Under every policy's rules the checkpointed run differs from the plain one
    only where float32 does, and no more: the loss and every other gradient are
    bit-equal. (Without the replay the recompute's dtypes differ and
    torch.utils.checkpoint raises CheckpointError; without ``torch.xla`` it
    raised AttributeError.) The cuda rules run in bfloat16 here: XLA:CPU
    emulates float16 arithmetic, and at backend level 0 its rounding of float16
    intermediates follows the fusions, which the recompute changes (the HLO's
    casts are the same; at XLA's default level float16 differs only as float32
    does). The float16 casts are checked bit for bit on the blocks above."""
    differences = _differences(device, policy, dtype)
    assert set(differences) <= set(_float32_differences(device)), differences
    assert all(v <= 2 * 2.0 ** -23 for v in differences.values()), differences
