"""The TPU policy on XLA:CPU: every listed op, dtypes and bits vs a manual cast."""
import pytest
import torch
import torch_xla

from tests.support.attention_reference import reference
from tests.support.op_cases import CASES, build, outputs
from xla_amp import autocast, policies

TPU = policies.get("tpu")


def test_every_tpu_op_has_a_case():
    assert set(TPU.categories) <= set(CASES), sorted(set(TPU.categories) - set(CASES))


def _check(op, device, input_dtype, target):
    floats, extra = build(op, device)
    floats = [t.to(input_dtype) for t in floats]
    with autocast(device, policy="tpu"):
        got = outputs(CASES[op].call(*floats, *extra))
    assert not torch.is_autocast_enabled("xla")
    control = outputs(CASES[op].control(target)(*[t.to(target) for t in floats], *extra))
    assert got, f"{op} produced no floating output"
    assert len(got) == len(control)
    for g, c in zip(got, control):
        assert g.dtype == target, f"{op}: {g.dtype} != {target}"
        assert c.dtype == target
        assert torch.equal(g.cpu(), c.cpu()), f"{op}: values differ from the manual cast"


@pytest.mark.parametrize("op", TPU.ops_in("lower_precision_fp"))
def test_lower_precision_ops_run_in_bf16(op, device):
    _check(op, device, torch.float32, torch.bfloat16)


@pytest.mark.parametrize("op", TPU.ops_in("fp32"))
def test_fp32_ops_run_in_fp32(op, device):
    _check(op, device, torch.bfloat16, torch.float32)


@pytest.mark.parametrize("op", TPU.ops_in("promote"))
def test_promote_ops_widen_mixed_inputs(op, device):
    floats, extra = build(op, device)
    mixed = [floats[0].bfloat16(), *floats[1:]]
    with autocast(device, policy="tpu"):
        got = outputs(CASES[op].call(*mixed, *extra))
        same = outputs(CASES[op].call(*[t.bfloat16() for t in floats], *extra))
    control = outputs(CASES[op].call(*[t.float() for t in mixed], *extra))
    assert got[0].dtype == torch.float32
    assert torch.equal(got[0].cpu(), control[0].cpu())
    assert same[0].dtype == torch.bfloat16  # all bf16: nothing to widen


def test_matmul_operator_form(device):
    a, b = torch.randn(3, 4, device=device), torch.randn(4, 2, device=device)
    with autocast(device, policy="tpu"):
        assert (a @ b).dtype == torch.bfloat16
        assert a.matmul(b).dtype == torch.bfloat16  # Tensor method


def test_unlisted_op_runs_in_input_type(device):
    a = torch.randn(4, 4, device=device)
    with autocast(device, policy="tpu"):
        assert torch.sum(a).dtype == torch.float32
        assert torch.sum(a.bfloat16()).dtype == torch.bfloat16
        assert torch.tanh(a).dtype == torch.float32


def _census(tensor):
    """[(dtype, opcode)] of every instruction in the graph computing `tensor`."""
    import re
    text = torch_xla._XLAC._get_xla_tensors_hlo([tensor])
    return re.findall(r"= (\w+)\[[^\]]*\][^ ]* ([a-z][\w-]*)\(", text)


def _dtypes_of(census, opcode):
    return {d for d, op in census if op == opcode}


def test_hlo_dot_and_convolution_are_bf16(device):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(1, 4, 3).to(device)
    lin = torch.nn.Linear(4 * 6 * 6, 5).to(device)
    x = torch.randn(2, 1, 8, 8, device=device)
    with autocast(device, policy="tpu"):
        out = lin(torch.flatten(conv(x), 1))
    census = _census(out)
    assert _dtypes_of(census, "convolution") == {"bf16"}
    assert _dtypes_of(census, "dot") == {"bf16"}


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, 1),
    lambda x: torch.log_softmax(x, 1),
    lambda x: torch.nn.functional.cross_entropy(x, torch.tensor([0, 2], device=x.device)),
    lambda x: torch.nn.functional.mse_loss(x, torch.zeros_like(x)),
], ids=["softmax", "log_softmax", "cross_entropy", "mse_loss"])
def test_hlo_softmax_and_losses_are_f32(device, fn):
    x = torch.randn(2, 5, device=device).bfloat16()
    with autocast(device, policy="tpu"):
        out = fn(x)
    census = _census(out)
    reductions = _dtypes_of(census, "reduce") | _dtypes_of(census, "exponential")
    assert reductions == {"f32"}, census
    assert ("f32", "convert") in census  # the bf16 input was widened first


@pytest.mark.parametrize("fn", [torch.cat, torch.stack])
def test_hlo_cat_and_stack_promote(device, fn):
    a = torch.randn(2, 3, device=device)
    torch_xla.sync()  # `a` becomes device data: the graph holds only the op
    with autocast(device, policy="tpu"):
        mixed = fn([a.bfloat16(), a])
        low = fn([a.bfloat16(), a.bfloat16()])
    assert _dtypes_of(_census(mixed), "concatenate") == {"f32"}
    assert _dtypes_of(_census(low), "concatenate") == {"bf16"}


def test_sdpa_takes_mixed_inputs_in_bfloat16(device):
    """pytorch/xla#7299's entry (commented out in torch_xla 2.9, where mixed
    inputs raise "same dtype"): q and k in float32 (Llama's rotary embedding
    promotes them) with v in bfloat16 run in bfloat16, bit-equal to the
    hand-written bf16 attention (tests/support/attention_reference.py)."""
    q = torch.randn(2, 4, 8, 16).to(device)
    v = q.bfloat16()
    with autocast(device, policy="tpu"):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, v, is_causal=True)
    assert out.dtype == torch.bfloat16
    control = reference(q, q, v, torch.bfloat16, is_causal=True)
    assert torch.equal(out.cpu(), control.cpu())


def test_llama_trains_without_the_kv_cache(device):
    """Hugging Face Llama as the Trainer runs it (use_cache=False), forward and
    backward under the tpu rules: attention in bfloat16, every gradient finite."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)).to(device).train()
    seen = []
    model.model.layers[0].self_attn.o_proj.register_forward_hook(
        lambda m, i, o: seen.append(i[0].dtype))  # the attention output, before o_proj
    tokens = torch.randint(0, 128, (2, 16)).to(device)
    with autocast(device, policy="tpu"):
        loss = model(tokens, labels=tokens, use_cache=False).loss
    loss.backward()
    torch_xla.sync()
    assert seen == [torch.bfloat16]
    assert torch.isfinite(loss.cpu())
    assert all(torch.isfinite(p.grad.cpu()).all() for p in model.parameters())
