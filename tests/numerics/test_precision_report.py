"""autocast(record=True) / explain: the engine's own record of what ran in
which dtype, checked against the HLO it produced."""
import collections
import json
import re

import pytest
import torch
from torch import nn

import xla_amp
from xla_amp import policies
from tests.support import hlo

POLICIES = ["tpu", "cuda", "cpu", "tpu+linear_fp32"]
HLO_TYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
# HLO dot instructions per recorded op; XLA's SDPA lowering computes its two
# matmuls in float32 whatever its input dtype (measured: 2 f32 dots).
DOTS = {"aten::linear": 1, "aten::matmul": 1, "aten::mm": 1, "aten::addmm": 1,
        "aten::bmm": 1, "aten::baddbmm": 1}


def _policy(name):
    if name == "tpu+linear_fp32":
        return policies.get("tpu").with_overrides(fp32=["aten::linear"])
    return name


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def cnn():
    second = Block()
    second.conv = nn.Conv2d(8, 8, 3, padding=1)
    return nn.Sequential(Block(), second, nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def transformer():
    return nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)


def _hlo_ops(text, opcode):
    """dtype -> count of `opcode` instructions (a tuple result: its first element)."""
    out = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%\S+ = (.*?) ([a-z-]+)\(", line)
        if m and m.group(2) == opcode:
            dtype = re.search(r"(\w+)\[", m.group(1)).group(1)
            if dtype in HLO_TYPE:  # floating results only
                out[HLO_TYPE[dtype]] += 1
    return out


COMPOSITE = {"aten::linear", "aten::matmul", "aten::scaled_dot_product_attention"}


def _expected(report, per_op):
    """HLO instructions by dtype that the rows predict. A composite op left
    uncast ("none") decomposes into ops recorded as rows of their own."""
    out = collections.Counter()
    for r in report.rows:
        if r["category"] == "none" and r["op"] in COMPOSITE:
            continue
        if r["op"] in per_op:
            out[r["dtype"]] += per_op[r["op"]] * r["count"]
        if per_op is DOTS and r["op"] == "aten::scaled_dot_product_attention":
            out[r["dtype"]] += 2 * r["count"]  # its two matmuls, in the row's dtype
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_rows_agree_with_hlo(device, model, policy):
    torch.manual_seed(0)
    m = (cnn() if model == "cnn" else transformer()).to(device)
    x = torch.randn(2, 3, 8, 8) if model == "cnn" else torch.randn(2, 5, 32)
    with xla_amp.autocast(device, policy=_policy(policy), record=True) as ac:
        y = m(x.to(device))
    report = ac.report()
    text = hlo(y)
    assert _hlo_ops(text, "dot") == _expected(report, DOTS)
    assert _hlo_ops(text, "convolution") == _expected(report, {"aten::conv2d": 1})
    if model == "cnn":  # BatchNorm (training) and max pooling, one instruction each
        assert _hlo_ops(text, "batch-norm-training") == _expected(
            report, {"aten::batch_norm": 1}) != {}
        assert _hlo_ops(text, "reduce-window") == _expected(report, {"aten::max_pool2d": 1})
    assert sum(_hlo_ops(text, "dot").values()) > 0
    dtype = {"tpu": "bfloat16", "cuda": "float16", "cpu": "bfloat16"}.get(policy, "bfloat16")
    linear = [r for r in report.rows if r["op"] == "aten::linear"]
    assert linear and all(r["dtype"] == ("float32" if policy.endswith("fp32") else dtype)
                          for r in linear)
    assert all(r["in_dtypes"][0] in ("float32", dtype) for r in linear)
    # recording changes nothing: the same graph with record off (a fresh
    # copy: the first forward moved BatchNorm's running statistics)
    torch.manual_seed(0)
    m = (cnn() if model == "cnn" else transformer()).to(device)
    with xla_amp.autocast(device, policy=_policy(policy)):
        y2 = m(x.to(device))
    import torch_xla
    assert torch_xla._XLAC._get_graph_hash([y2]) == torch_xla._XLAC._get_graph_hash([y])


def test_module_names_nested_and_top_level(device):
    m = cnn().to(device)
    x = torch.randn(2, 3, 8, 8, device=device)
    with xla_amp.autocast(device, policy="tpu", record=True) as ac:
        loss = nn.functional.cross_entropy(m(x), torch.zeros(2, dtype=torch.long, device=device))
    rows = {(r["module"], r["op"]): r for r in ac.report().rows}
    assert rows[("0.conv", "aten::conv2d")]["dtype"] == "bfloat16"
    assert rows[("1.conv", "aten::conv2d")]["in_dtypes"] == ["bfloat16", "float32", "float32"]
    assert rows[("0.bn", "aten::batch_norm")]["category"] == "fp32"
    assert rows[("0", "aten::relu")]["count"] == 1
    assert rows[("4", "aten::linear")]["category"] == "lower_precision_fp"
    top = rows[("", "aten::cross_entropy_loss")]
    assert (top["category"], top["in_dtypes"], top["dtype"]) == ("fp32", ["bfloat16", "int64"],
                                                                 "float32")
    assert loss.dtype == torch.float32
    # no hook left behind, nothing recorded outside the region
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.nn.modules.module._global_forward_hooks


def test_counts_repeat_calls_and_shared_modules(device):
    lin = nn.Linear(4, 4)
    m = nn.Sequential(lin, nn.ReLU(), lin).to(device)  # one module under two names
    report = xla_amp.explain(m, torch.randn(3, 4, device=device), policy="cuda")
    rows = [r for r in report.rows if r["op"] == "aten::linear"]
    assert [(r["module"], r["in_dtypes"][0], r["count"]) for r in rows] == [
        ("0", "float32", 1), ("0", "float16", 1)]


def test_diff_between_policies(device):
    m = cnn().to(device)
    x = torch.randn(2, 3, 8, 8, device=device)
    tpu, cuda = xla_amp.explain(m, x, policy="tpu"), xla_amp.explain(m, x, policy="cuda")
    diff = {(r["module"], r["op"]): r for r in tpu.diff(cuda).rows}
    # bf16 under tpu and fp16 under cuda is the same decision: conv2d is no difference
    assert ("0.conv", "aten::conv2d") not in diff and ("4", "aten::linear") not in diff
    assert diff[("0.bn", "aten::batch_norm")]["category"] == ["fp32", "fp32_compute"]
    assert diff[("0", "aten::relu")]["category"] == ["lower_precision_fp", "none"]
    assert diff[("0", "aten::relu")]["dtype"] == ["bfloat16", "float16"]
    assert len(tpu.diff(tpu)) == 0
    # an override makes exactly its op differ
    fp32_linear = xla_amp.explain(m, x, policy=_policy("tpu+linear_fp32"))
    assert [(r["module"], r["op"], r["dtype"]) for r in tpu.diff(fp32_linear).rows] == [
        ("4", "aten::linear", ["bfloat16", "float32"])]
    assert "| 0.bn | aten::batch_norm | fp32 | fp32_compute |" in tpu.diff(cuda).table()
    assert "(tpu)" in tpu.diff(cuda).table() and "(cuda)" in tpu.diff(cuda).table()


def test_table_and_json_round_trip(device):
    report = xla_amp.explain(nn.Linear(4, 2).to(device), torch.randn(1, 4, device=device),
                             policy="tpu")
    assert report.policy == "tpu" and report.dtype == "bfloat16"
    assert report.rows == [{"module": "", "op": "aten::linear", "category": "lower_precision_fp",
                            "in_dtypes": ["float32"] * 3, "dtype": "bfloat16", "count": 1}]
    assert "| `` | aten::linear | lower_precision_fp | float32, float32, float32 | bfloat16 | 1 |" \
        in report.table()
    again = xla_amp.PrecisionReport.from_json(report.to_json())
    assert again == report and json.loads(report.to_json())["policy"] == "tpu"


def test_explain_leaves_buffers_and_only_traces(device):
    from tests.support import clear_metrics, count
    m = cnn().to(device).train()
    bn = m[0].bn
    before = bn.running_mean, bn.num_batches_tracked
    x = torch.randn(2, 3, 8, 8, device=device)
    import torch_xla
    torch_xla.sync()
    clear_metrics()
    report = xla_amp.explain(m, x)
    assert (bn.running_mean, bn.num_batches_tracked) == before
    assert count("ExecuteTime") == 0 and count("TransferFromDeviceTime") == 0
    assert report.policy == "cpu"  # XLA:CPU's hardware policy


def test_nested_regions_keep_recording_and_exceptions_clean_up(device):
    m = nn.Linear(4, 4).to(device)
    x = torch.randn(2, 4, device=device)
    outer = xla_amp.autocast(device, policy="tpu", record=True)
    with pytest.raises(RuntimeError, match="boom"):
        with outer:
            with xla_amp.autocast(device, policy="cuda"):
                m(x)
            raise RuntimeError("boom")
    assert [r["dtype"] for r in outer.report().rows] == ["float16"]
    assert not torch.nn.modules.module._global_forward_hooks
    # the next region records afresh; a plain region records nothing
    with xla_amp.autocast(device, policy="tpu"):
        m(x)
    with outer:
        pass
    assert outer.report().rows == []


def test_nested_recording_region_rows_count_in_the_outer_report(device):
    """report() covers everything that ran inside the region: a recording
    region nested in it keeps its own rows and hands them on."""
    m = nn.Linear(4, 4).to(device)
    x = torch.randn(2, 4, device=device)
    with xla_amp.autocast(device, policy="tpu", record=True) as outer:
        m(x)
        with xla_amp.autocast(device, policy="cuda", record=True) as inner:
            m(x)
            m(x)
    rows = {(r["op"], r["dtype"]): r["count"] for r in outer.report().rows}
    assert rows == {("aten::linear", "bfloat16"): 1, ("aten::linear", "float16"): 2}
    assert [(r["dtype"], r["count"]) for r in inner.report().rows] == [("float16", 2)]


def test_recording_inside_a_module_forward(device):
    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            with xla_amp.autocast(x.device, policy="tpu", record=True) as ac:
                y = self.fc(x)
            self.report = ac.report()
            return y

    outer = nn.Sequential(Inner()).to(device)
    outer(torch.randn(2, 4, device=device))
    assert [r["module"] for r in outer[0].report.rows] == [""]  # fc is that region's root


def test_bad_input(device):
    with pytest.raises(ValueError, match="record must be a bool"):
        xla_amp.autocast(device, record=1)
    with pytest.raises(RuntimeError, match="record=True"):
        xla_amp.autocast(device).report()
    with pytest.raises(RuntimeError, match="not been entered"):
        xla_amp.autocast(device, record=True).report()
    with pytest.raises(ValueError, match="no-such-policy"):
        xla_amp.explain(nn.Linear(2, 2).to(device), torch.ones(1, 2, device=device),
                        policy="no-such-policy")


def test_recording_region_under_torch_compile_runs_eagerly(device):
    m = nn.Linear(4, 4).to(device)
    seen = {}

    def f(x):
        with xla_amp.autocast(device, policy="tpu", record=True) as ac:
            y = m(x)
        seen["region"] = ac
        return y

    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(f, backend="openxla")(torch.randn(2, 4, device=device))
    assert not [w for w in caught if "does not know how to trace" in str(w.message)]
    assert y.dtype == torch.bfloat16
    assert [(r["module"], r["op"], r["dtype"]) for r in seen["region"].report().rows] == [
        ("", "aten::linear", "bfloat16")]
