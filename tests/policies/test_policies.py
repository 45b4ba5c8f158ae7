"""The built-in policies as data: files, citations, registry, hardware choice,
loader errors, the generated op table, and a few HLO-level checks.
(Per-op numerics are in test_conformance.py.)"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch_xla

import xla_amp
from xla_amp import policies
from xla_amp.policies import _ops as ops

from tests.support import hlo
from tests.support.policy_files import write_policy
from xla_amp.policies._policy import CATEGORIES, load

ROOT = Path(__file__).resolve().parents[2]
POLICY_DIR = ROOT / "xla_amp" / "policies"

# Overloads PyTorch registers for AutocastCUDA that "cuda" leaves out (cuDNN /
# CUDA-kernel entry points; the cuda.toml header says so).
CUDA_ONLY = {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose",
             "aten::_cudnn_rnn", "aten::_scaled_dot_product_flash_attention"}


# Source key -> the registered kernel its entries stand in for.
STAND_INS = {"cuda": ("cudnn", "aten::_cudnn_rnn"), "cpu": ("onednn", "aten::mkldnn_rnn_layer")}


def _expanded(policy) -> dict[str, str]:
    return policy.expanded()


def test_builtin_names():
    assert {"tpu", "cuda", "cpu", "xpu", "hpu"} <= set(policies.names())


@pytest.mark.parametrize("hw,name", [("TPU", "tpu"), ("NEURON", "tpu"), ("CUDA", "cuda"),
                                     ("CPU", "cpu")])
def test_hardware_selects_policy(hw, name):
    assert policies.for_hardware(hw) is policies.get(name)


def test_unknown_hardware_names_it():
    with pytest.raises(ValueError, match="'IPU'"):
        policies.for_hardware("IPU")


@pytest.mark.parametrize("name,default,supported", [
    ("cuda", torch.float16, {torch.float16, torch.bfloat16}),
    ("cpu", torch.bfloat16, {torch.bfloat16, torch.float16}),
    ("xpu", torch.bfloat16, {torch.bfloat16, torch.float16}),
    ("hpu", torch.bfloat16, {torch.bfloat16}),
])
def test_dtypes(name, default, supported):
    p = policies.get(name)
    assert p.default_dtype == default and set(p.supported_dtypes) == supported


def test_xla_cpu_device_uses_cpu_policy(device):
    """XLA:CPU selects "cpu": bf16 matmul, conv_transpose in bf16 (002), exp
    left alone (not a CPU-autocast op, unlike CUDA)."""
    a = torch.randn(4, 4).to(device)
    x = torch.randn(1, 2, 4, 4).to(device)
    w = torch.randn(2, 3, 3, 3).to(device)
    with xla_amp.autocast(device):
        assert torch.get_autocast_dtype("xla") == torch.bfloat16
        assert (a @ a).dtype == torch.bfloat16
        assert torch.nn.functional.conv_transpose2d(x, w).dtype == torch.bfloat16
        assert torch.exp(a.bfloat16()).dtype == torch.bfloat16


def test_cuda_policy_defaults_to_float16(device):
    a = torch.randn(4, 4).to(device)
    with xla_amp.autocast(device, policy="cuda"):
        assert torch.get_autocast_dtype("xla") == torch.float16
        assert (a @ a).dtype == torch.float16


def test_hpu_rejects_float16(device):
    a = torch.randn(4, 4).to(device)
    with pytest.warns(UserWarning, match="'hpu' does not support torch.float16"):
        with xla_amp.autocast(device, policy="hpu", dtype=torch.float16):
            assert not torch.is_autocast_enabled("xla")
            assert (a @ a).dtype == torch.float32


@pytest.mark.parametrize("name,key", [("cuda", "AutocastCUDA"), ("cpu", "AutocastCPU")])
def test_tables_equal_pytorch_registrations(name, key):
    """Exactly the aten overloads PyTorch 2.9 autocasts on that device.
    (Libraries add their own once imported, e.g. torchvision::roi_align;
    those are not in the documents.)"""
    policy = policies.get(name)
    mine = set(_expanded(policy))
    theirs = {op for op in torch._C._dispatch_get_registrations_for_dispatch_key(key)
              if op.startswith("aten::")}
    if name == "cuda":
        theirs -= CUDA_ONLY
    # Entries citing the entry points that reach a kernel XLA never runs stand
    # in for that kernel's registration (docs/policies.md, "Recurrent networks")
    source, kernel = STAND_INS[name]
    stand_ins = {o for op, why in policy.sources.items() if why.startswith(source + ":")
                 for o in ops.overloads(op)}
    assert kernel in CUDA_ONLY | theirs and stand_ins, (kernel, stand_ins)
    assert mine - stand_ins == theirs


@pytest.mark.parametrize("name,op,category", [
    ("cuda", "aten::sum.dim_IntList", "fp32_set_opt_dtype"),
    ("cuda", "aten::softmax.int", "fp32_set_opt_dtype"),
    ("cuda", "aten::cumsum", "fp32_set_opt_dtype"),
    ("cuda", "aten::norm.ScalarOpt_dim", "fp32_append_dtype"),
    ("cuda", "aten::pow.Scalar", "fp32"),
    ("cuda", "aten::reciprocal", "fp32"),
    ("cuda", "aten::gru_cell", "lower_precision_fp"),
    ("cuda", "aten::conv1d", "lower_precision_fp"),
    ("cuda", "aten::conv1d.default", "lower_precision_fp"),
    ("cuda", "aten::conv1d.padding", None),
    ("cuda", "aten::index_put", "promote"),
    ("cuda", "aten::binary_cross_entropy", "banned"),
    ("cpu", "aten::prod.dim_int", "fp32"),
    ("cpu", "aten::conv_transpose2d", "lower_precision_fp"),
    ("cpu", "aten::conv1d.padding", "lower_precision_fp"),
    ("cpu", "aten::_convolution", None),
    ("cpu", "aten::gelu", None),
    ("cpu", "aten::cat", "promote"),
    ("cpu", "aten::cat.names", None),
    ("xpu", "aten::binary_cross_entropy", "fp32"),
    ("xpu", "aten::log_softmax.int", "fp32"),
    ("xpu", "aten::conv_transpose2d", "lower_precision_fp"),
    ("hpu", "aten::mul.Tensor", "lower_precision_fp"),
    ("hpu", "aten::exp", "fp32"),
    ("hpu", "aten::div.Tensor", "fp32"),
    ("hpu", "aten::add.Tensor", "promote"),
    ("hpu", "aten::add_.Tensor", None),
])
def test_category_lookup(name, op, category):
    assert policies.get(name).category(op) == category


def test_banned_reason_explains_the_alternative(device):
    p = policies.get("cuda")
    assert "binary_cross_entropy_with_logits" in p.banned_reasons["aten::binary_cross_entropy"]
    x = torch.rand(4).to(device)
    with pytest.raises(RuntimeError, match="banned.*'cuda'.*binary_cross_entropy_with_logits"):
        with xla_amp.autocast(device, policy="cuda"):
            torch.nn.functional.binary_cross_entropy(x, x)
    # outside autocast (and under other policies) it runs
    assert torch.nn.functional.binary_cross_entropy(x, x).dtype == torch.float32
    with xla_amp.autocast(device, policy="cpu"):
        assert torch.nn.functional.binary_cross_entropy(x, x).dtype == torch.float32


@pytest.mark.parametrize("name", ["cuda", "cpu", "xpu", "hpu"])
def test_every_entry_cites_a_listed_source(name):
    p = policies.get(name)
    text = (POLICY_DIR / f"{name}.toml").read_text()
    import tomllib
    sources = tomllib.loads(text)["sources"]
    for key, document in sources.items():
        if key != "torch":  # a reference document: cited by its public original
            assert "https://" in document and "shared/" not in document, (key, document)
    for op in (*p.categories, *p.uncast):
        cite = p.sources.get(op) or p.uncast[op]
        key = cite.split(":")[0]
        assert key in sources, (op, cite)


@pytest.mark.parametrize("name,seed", [("cuda", "002"), ("cpu", "002"), ("xpu", "000"),
                                       ("hpu", "004")])
def test_documents_names_are_all_mapped(name, seed):
    """Each name the policy's document lists appears in some citation."""
    p = policies.get(name)
    cited = " ".join(list(p.sources.values()) + list(p.uncast.values()))
    cited += (POLICY_DIR / f"{name}.toml").read_text()  # header mapping notes
    doc_names = {
        "cuda": "__matmul__ multi_dot GRUCell LSTMCell RNNCell __pow__ __rdiv__ __rpow__ "
                "__rtruediv__ cross_entropy normalize softmin grid_sample norm layer_norm",
        "cpu": "_convolution mkldnn_rnn_layer grid_sampler _grid_sampler_2d_cpu_fallback "
               "linalg_vecdot _native_multi_head_attention",
        "xpu": "nll_loss_nd frobenius_norm _thnn_fused_gru_cell chain_matmul",
        "hpu": "truediv iadd feature_dropout embedding_bag topk",
    }[name].split()
    for n in doc_names:
        assert re.search(rf"\b{re.escape(n)}\b", cited), n


def test_op_tables_show_policies_side_by_side():
    text = (ROOT / "docs" / "op_tables.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| op |"))
    assert [c.strip() for c in header.strip("|").split("|")][1:] == policies.builtin_names()
    row = next(line for line in text.splitlines()
               if line.startswith("| `aten::binary_cross_entropy` |"))
    cells = dict(zip(policies.builtin_names(), [c.strip() for c in row.strip("|").split("|")][1:]))
    assert cells["cuda"] == "**banned**" and cells["cpu"] == "fp32"


# ---- the loader's errors -------------------------------------------------------

def _write(tmp_path, body):
    return write_policy(tmp_path, body)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "nope.toml"))):
        load(tmp_path / "nope.toml")


def test_unknown_op_gives_file_line_and_close_names(tmp_path):
    f = _write(tmp_path, '[fp32]\n"aten::exp" = "x"\n"aten::softmaxx" = "x"\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(f))}:6: unknown op "
                                         r"'aten::softmaxx'; closest known names: .*aten::softmax"):
        load(f)


def test_op_in_two_categories(tmp_path):
    f = _write(tmp_path, '[fp32]\n"aten::exp" = "x"\n[promote]\n"aten::exp" = "y"\n')
    with pytest.raises(ValueError, match=r":5: aten::exp is in two categories"):
        load(f)


def test_set_opt_dtype_needs_a_dtype_argument(tmp_path):
    f = _write(tmp_path, '[fp32_set_opt_dtype]\n"aten::exp" = "x"\n')
    with pytest.raises(ValueError, match=r":5: aten::exp has no dtype argument"):
        load(f)


def test_append_dtype_needs_a_dtype_overload(tmp_path):
    f = _write(tmp_path, '[fp32_append_dtype]\n"aten::exp" = "x"\n')
    with pytest.raises(ValueError, match=r":5: aten::exp has no overload that appends"):
        load(f)


def test_bad_section_and_dtype(tmp_path):
    with pytest.raises(ValueError, match=r"\[fp64\] is not a category"):
        load(_write(tmp_path, '[fp64]\n"aten::exp" = "x"\n'))
    f = tmp_path / "d.toml"
    f.write_text('name = "t"\ndefault_dtype = "half"\nsupported_dtypes = ["bfloat16"]\n')
    with pytest.raises(ValueError, match=r"d.toml:2: dtype 'half'"):
        load(f)


def test_uncast_entry_cannot_also_be_cast(tmp_path):
    f = _write(tmp_path, '[uncast]\n"aten::gelu" = "x"\n[fp32]\n"aten::gelu" = "y"\n')
    with pytest.raises(ValueError, match=r"aten::gelu is both in \[fp32\] and in \[uncast\]"):
        load(f)


def test_default_overload_spelling():
    assert ops.overloads("aten::conv1d.default") == ("aten::conv1d",)
    assert set(ops.overloads("aten::conv1d")) == {"aten::conv1d", "aten::conv1d.padding"}
    with pytest.raises(ValueError, match="aten::conv1d.nope"):
        ops.validate("aten::conv1d.nope")


# ---- what the compiled graphs contain -------------------------------------------

def _hlo(t):
    return hlo(t)


def test_cuda_float16_matmul_hlo(device):
    a = torch.randn(4, 4).to(device)
    with xla_amp.autocast(device, policy="cuda"):
        y = a @ a
    hlo = _hlo(y)
    assert re.search(r"f16\[4,4\]\{1,0\} dot\(", hlo), hlo


def test_cuda_norm_appends_float32_dtype_hlo(device):
    """fp32_append_dtype: the bf16 input is converted to f32 and reduced in f32."""
    x = torch.randn(4, 4).to(device).bfloat16()
    with xla_amp.autocast(device, policy="cuda", dtype=torch.bfloat16):
        y = torch.ops.aten.norm.Scalar(x, 2)
    assert y.dtype == torch.float32
    hlo = _hlo(y)
    assert re.search(r"f32\[4,4\]\{1,0\} convert\(bf16\[4,4\]", hlo), hlo
    assert torch.equal(y.cpu(), torch.ops.aten.norm.Scalar(x.float(), 2).cpu())
    # an explicit dtype is respected (no cast, no override)
    with xla_amp.autocast(device, policy="cuda", dtype=torch.bfloat16):
        z = torch.ops.aten.norm.ScalarOpt_dtype(x, 2, dtype=torch.bfloat16)
    assert z.dtype == torch.bfloat16


def test_cuda_sum_sets_float32_dtype_unless_given(device):
    x = torch.randn(4, 4).to(device).bfloat16()
    with xla_amp.autocast(device, policy="cuda", dtype=torch.bfloat16):
        s = x.sum()
        s16 = x.sum(dtype=torch.bfloat16)
    assert s.dtype == torch.float32 and s16.dtype == torch.bfloat16
    assert torch.equal(s.cpu(), x.sum(dtype=torch.float32).cpu())
    assert torch.equal(s16.cpu(), x.sum().cpu())


# ---- cuda in float16 (its default), a small subset: fp16 is slow on XLA:CPU -------

F16_CASES = {
    "mm": (lambda: [torch.randn(4, 4), torch.randn(4, 4)], torch.mm, torch.float32,
           torch.float16),
    "exp": (lambda: [torch.randn(4)], torch.exp, torch.float16, torch.float32),
    "softmax": (lambda: [torch.randn(4)], lambda x: torch.softmax(x, 0), torch.float16,
                torch.float32),
    "cat": (lambda: [torch.randn(2), torch.randn(2)], lambda a, b: torch.cat([a, b]),
            None, torch.float32),
}


@pytest.mark.parametrize("name", sorted(F16_CASES))
def test_cuda_float16(device, name):
    make, call, in_dtype, out_dtype = F16_CASES[name]
    torch.manual_seed(0)
    xs = [t.to(device) for t in make()]
    if in_dtype is not None:
        xs = [x.to(in_dtype) for x in xs]
    else:  # promote: one fp16 input, one fp32 input
        xs = [xs[0].half(), xs[1]]
    with xla_amp.autocast(device, policy="cuda"):
        got = call(*xs)
    want = call(*[x.to(out_dtype) for x in xs])
    assert got.dtype == out_dtype
    assert torch.equal(got.cpu(), want.cpu())


def test_categories_constant_matches_files():
    for name in ("cuda", "cpu", "xpu", "hpu"):
        assert set(policies.get(name).categories.values()) <= set(CATEGORIES)
