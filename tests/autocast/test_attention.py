"""scaled_dot_product_attention under a policy that casts it (tpu, cuda):
computed in the region's dtype (xla_amp/policies/_attention.py), not in the float32
PyTorch's math path converts low inputs back to. On the lowered program:
every dot of the forward and backward in the region's dtype, the softmax's
exponentials in float32; values bit-equal to the hand-written control
(tests/support/attention_reference.py) on every mask form; an fp32 rule
gets float32 dots; bad input raises PyTorch's own error and leaves the
region as it was; Hugging Face Llama, GPT-2 and BERT steps without a
float32 dot; torch.compile gives eager's values."""
import collections
import re

import pytest
import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm

import xla_amp
from xla_amp import _engine, policies

from tests.support.attention_reference import reference
from tests.support.fp8 import dots

SDPA = "aten::scaled_dot_product_attention"
LOW = {"tpu": torch.bfloat16, "cuda": torch.float16}
HLO_LOW = {"tpu": "bf16", "cuda": "f16"}


def _hlo(ts):
    return torch_xla._XLAC._get_xla_tensors_hlo(ts)


def _exponentials(hlo):
    return re.findall(r"= (\w+)\[[^\]]*\][^ ]* exponential\(", hlo)


def _inputs(device, form, requires_grad=False):
    """(q, k, v, kwargs, reference kwargs) of one form; float32 inputs."""
    torch.manual_seed(0)
    heads_kv = 2 if form == "gqa" else 4
    q = torch.randn(2, 4, 16, 32)
    k, v = torch.randn(2, heads_kv, 16, 32), torch.randn(2, heads_kv, 16, 32)
    kw, ref = {}, {}
    if form == "causal":
        kw = ref = {"is_causal": True}
    elif form == "bool_mask":
        mask = torch.rand(16, 16) > 0.3
        mask[:, 0] = True  # no row fully masked here (that case: its own test)
        kw, ref = {"attn_mask": mask.to(device)}, {"mask": mask.to(device)}
    elif form == "additive_mask":
        mask = torch.randn(2, 1, 16, 16)
        kw, ref = {"attn_mask": mask.to(device)}, {"mask": mask.to(device)}
    elif form == "scale":
        kw = ref = {"scale": 0.3}
    elif form == "negative_scale":
        kw = ref = {"scale": -0.2}
    elif form == "gqa":
        kw, ref = {"enable_gqa": True, "is_causal": True}, {"gqa": True, "is_causal": True}
    q, k, v = (t.to(device).requires_grad_(requires_grad) for t in (q, k, v))
    if form == "mixed":  # Llama's rotary q/k in float32, v from a low linear
        v = v.detach().bfloat16().requires_grad_(requires_grad)
    return q, k, v, kw, ref


FORMS = ["plain", "causal", "bool_mask", "additive_mask", "scale", "negative_scale", "gqa",
         "mixed"]


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
@pytest.mark.parametrize("form", FORMS)
def test_every_dot_forward_and_backward_in_the_regions_dtype(device, policy, form):
    q, k, v, kw, _ = _inputs(device, form, requires_grad=True)
    with xla_amp.autocast(device, policy=policy):
        out = F.scaled_dot_product_attention(q, k, v, **kw)
    assert out.dtype == LOW[policy]
    out.float().sum().backward()
    hlo = _hlo([out, q.grad, k.grad, v.grad])
    found = dots(hlo)
    assert len(found) >= 6, found  # two forward, four backward
    low = HLO_LOW[policy]
    assert {d[1] for d in found} == {(low, low)}, found
    assert {d[2] for d in found} == {low}
    assert _exponentials(hlo) == ["f32"]


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
@pytest.mark.parametrize("form", FORMS)
def test_values_equal_the_hand_written_control(device, policy, form):
    q, k, v, kw, ref = _inputs(device, form)
    with xla_amp.autocast(device, policy=policy):
        out = F.scaled_dot_product_attention(q, k, v, **kw)
    want = reference(q, k, v, LOW[policy], **ref)
    assert out.dtype == want.dtype == LOW[policy]
    assert torch.equal(out.cpu(), want.cpu())


def test_a_fully_masked_row_is_zero_not_nan(device):
    q, k, v, _, _ = _inputs(device, "plain")
    mask = torch.ones(16, 16, dtype=torch.bool)
    mask[3] = False
    with xla_amp.autocast(device, policy="tpu"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(device))
    got = out.cpu()
    assert torch.isfinite(got).all() and torch.equal(got[:, :, 3], torch.zeros_like(got[:, :, 3]))
    want = reference(q, k, v, torch.bfloat16, mask=mask.to(device))
    assert torch.equal(got, want.cpu())


def test_an_fp32_rule_gets_float32_dots_and_no_rule_what_the_inputs_give(device):
    q, k, v, _, _ = _inputs(device, "causal", requires_grad=True)
    fp32 = policies.get("tpu").with_overrides(name="tpu, sdpa fp32", fp32=[SDPA])
    with xla_amp.autocast(device, policy=fp32):
        out = F.scaled_dot_product_attention(q.bfloat16(), k, v, is_causal=True)
    assert out.dtype == torch.float32
    out.sum().backward()
    found = dots(_hlo([out, q.grad, k.grad, v.grad]))
    assert found and {d[1] for d in found} == {("f32", "f32")}, found
    uncast = policies.get("tpu").with_overrides(name="tpu, sdpa uncast", remove=[SDPA])
    for dtype in (torch.float32, torch.bfloat16):
        with xla_amp.autocast(device, policy=uncast):
            out = F.scaled_dot_product_attention(q.detach().to(dtype), k.detach().to(dtype),
                                                 v.detach().to(dtype))
        assert out.dtype == dtype


def test_dropout_draws_from_the_device_generator_and_checkpointing_replays_it(device):
    """dropout_p > 0: the device's RNG (the same seed, the same mask) and
    activation checkpointing's recomputation draws the same mask again: its
    gradients equal the plain backward's."""
    q, k, v, _, _ = _inputs(device, "plain")

    def attend(q, k, v):
        with xla_amp.autocast(device, policy="tpu"):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    outs, grads = [], []
    for checkpointed in (False, True, False):
        xm.set_rng_state(7)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        if checkpointed:
            out = torch.utils.checkpoint.checkpoint(attend, *leaves, use_reentrant=False)
        else:
            out = attend(*leaves)
        out.float().square().sum().backward()
        outs.append(out.cpu())
        grads.append([t.grad.cpu() for t in leaves])
    assert out.dtype == torch.bfloat16
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[0], outs[1])
    for a, b in zip(grads[0], grads[1]):
        assert torch.equal(a, b)
    no_dropout = reference(q, k, v, torch.bfloat16)
    assert not torch.equal(outs[0], no_dropout.cpu())  # a mask was drawn


@pytest.mark.parametrize("case,pattern", [
    ("mask_shape", None),
    ("mask_dtype", "Expected attn_mask dtype to be bool or float or to match query dtype"),
    ("causal_and_mask", "Explicit attn_mask should not be set when is_causal=True"),
    ("gqa_heads", None)])
def test_bad_input_raises_pytorchs_error_and_leaves_the_region(device, case, pattern):
    q, k0, v0, _, _ = _inputs(device, "plain")
    k, v = k0, v0
    kw = {"mask_shape": {"attn_mask": torch.ones(16, 5, dtype=torch.bool).to(device)},
          "mask_dtype": {"attn_mask": torch.ones(16, 16, dtype=torch.long).to(device)},
          "causal_and_mask": {"attn_mask": torch.ones(16, 16, dtype=torch.bool).to(device),
                              "is_causal": True},
          "gqa_heads": {"enable_gqa": True}}[case]
    if case == "gqa_heads":
        k, v = k[:, :3], v[:, :3]
    with pytest.raises(Exception) as plain:  # PyTorch's (and XLA's) own, without xla_amp
        F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), **kw)
        _hlo([F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), **kw)])
    with xla_amp.autocast(device, policy="tpu"):
        before = (torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"),
                  _engine.active_policy_name(), _engine.policy_depth())
        with pytest.raises(type(plain.value)) as ours:
            _hlo([F.scaled_dot_product_attention(q, k, v, **kw)])
        assert (torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"),
                _engine.active_policy_name(), _engine.policy_depth()) == before
        after = F.scaled_dot_product_attention(q, k0, v0)
    if pattern:
        assert pattern in str(plain.value) and pattern in str(ours.value)
    assert after.dtype == torch.bfloat16
    assert {d[1] for d in dots(_hlo([after]))} == {("bf16", "bf16")}
    assert not torch.is_autocast_enabled("xla")


def test_the_precision_report_names_the_rule(device):
    q, k, v, _, _ = _inputs(device, "causal")
    with xla_amp.autocast(device, policy="tpu", record=True) as ac:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    rows = [r for r in ac.report().rows if r["op"] == SDPA]
    assert [(r["category"], r["dtype"], r["count"]) for r in rows] == [
        ("lower_precision_fp", "bfloat16", 1)]
    assert not [r for r in ac.report().rows if r["op"] in ("aten::matmul", "aten::bmm")]


def _step_dots(device, build, batch, policy):
    torch.manual_seed(0)
    model = build().to(device).train()
    with xla_amp.autocast(device, policy=policy):
        loss = model(**{k: t.to(device) if isinstance(t, torch.Tensor) else t
                        for k, t in batch.items()}).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return collections.Counter(d[1] for d in dots(_hlo([loss, *grads])))


def _models():
    import transformers as tr
    tok = torch.randint(0, 128, (2, 16))
    return {
        "llama": (lambda: tr.LlamaForCausalLM(tr.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)),
            {"input_ids": tok, "labels": tok}),
        "gpt2": (lambda: tr.GPT2LMHeadModel(tr.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)),
            {"input_ids": tok, "labels": tok}),
        "bert": (lambda: tr.BertForSequenceClassification(tr.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=128, max_position_embeddings=64)),
            {"input_ids": tok, "attention_mask": torch.ones(2, 16, dtype=torch.long),
             "labels": torch.tensor([0, 1])}),
    }


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_hugging_face_steps_have_no_float32_dot_unless_asked(device, name):
    """A training step (sdpa attention, the Transformers default) under the
    tpu rules: every dot bf16; with SDPA overridden to fp32, exactly
    attention's six dots a layer (two layers) become float32."""
    build, batch = _models()[name]
    if name == "llama":
        batch = dict(batch, use_cache=False)  # as the Trainer trains it
    got = _step_dots(device, build, batch, "tpu")
    assert set(got) == {("bf16", "bf16")} and got[("bf16", "bf16")] >= 30, got
    fp32 = policies.get("tpu").with_overrides(name="tpu, sdpa fp32", fp32=[SDPA])
    asked = _step_dots(device, build, batch, fp32)
    assert asked[("f32", "f32")] == 12, asked
    assert sum(asked.values()) == sum(got.values())


def test_compiled_attention_gives_eagers_values(device):
    q, k, v, _, _ = _inputs(device, "causal")

    def attend(q, k, v):
        with xla_amp.autocast(device, policy="tpu"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    graphs = []
    openxla = torch._dynamo.lookup_backend("openxla")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return openxla(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(attend, backend=backend)(q, k, v)
    assert len(graphs) == 1  # traced, not run eagerly
    eager = attend(q, k, v)
    assert compiled.dtype == eager.dtype == torch.bfloat16
    assert torch.equal(compiled.cpu(), eager.cpu())
    assert torch.equal(eager.cpu(), reference(q, k, v, torch.bfloat16, is_causal=True).cpu())


def test_a_policy_file_listing_attention_twice_is_refused_with_file_and_line(tmp_path):
    from tests.support.policy_files import write_policy
    f = write_policy(tmp_path, f'[lower_precision_fp]\n"{SDPA}" = "x"\n[fp32]\n"{SDPA}" = "y"\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(f))}:5: {SDPA} is in two categories"):
        policies.load(f)
