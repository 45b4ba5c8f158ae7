"""Policy.with_overrides and the XLA_AMP_*_OPS_LIST environment files."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import xla_amp
from xla_amp import policies


@pytest.fixture
def x(device):
    torch.manual_seed(0)
    return torch.randn(4, 4).to(device)


def test_with_overrides_returns_a_new_policy(device, x):
    base = policies.get("cpu")
    before = dict(base.categories)
    p = base.with_overrides(lower_precision_fp=["aten::gelu"], fp32=["aten::mm"],
                            promote=["aten::atan2"], remove=["aten::addmm"])
    assert dict(base.categories) == before            # the original is untouched
    assert p is not base and p.name == "cpu+overrides"
    assert p.category("aten::gelu") == "lower_precision_fp"
    assert p.category("aten::mm") == "fp32"
    assert p.category("aten::atan2") == "promote"
    assert p.category("aten::addmm") is None
    b = torch.randn(4).to(device)
    with xla_amp.autocast(device, policy=p):
        g = F.gelu(x)
        m = torch.mm(x.bfloat16(), x.bfloat16())
        am = torch.addmm(b, x, x)
        at = torch.atan2(x.bfloat16(), x)
    with xla_amp.autocast(device, policy=base):
        g0 = F.gelu(x)
        am0 = torch.addmm(b, x, x)
    assert g.dtype == torch.bfloat16 and g0.dtype == torch.float32
    assert torch.equal(g.cpu(), F.gelu(x.bfloat16()).cpu())
    xb = x.bfloat16().float()
    assert m.dtype == torch.float32 and torch.equal(m.cpu(), torch.mm(xb, xb).cpu())
    assert am.dtype == torch.float32 and am0.dtype == torch.bfloat16
    assert at.dtype == torch.float32


def test_override_by_name_and_banned_reason(device, x):
    p = policies.get("tpu").with_overrides(name="tpu-strict",
                                           banned={"aten::exp": "use torch.expm1 here"})
    assert p.name == "tpu-strict"
    with pytest.raises(RuntimeError, match="use torch.expm1 here"):
        with xla_amp.autocast(device, policy=p):
            torch.exp(x)


def test_unknown_op_names_it_and_close_names():
    with pytest.raises(ValueError, match=r"unknown op 'aten::geluu'; closest known names: "
                                         r".*aten::gelu"):
        policies.get("cuda").with_overrides(fp32=["aten::geluu"])


def test_op_in_two_categories_is_refused():
    with pytest.raises(ValueError, match="aten::gelu is given two categories"):
        policies.get("cuda").with_overrides(fp32=["aten::gelu"],
                                            lower_precision_fp=["aten::gelu"])
    with pytest.raises(ValueError, match="aten::mm is both removed and put"):
        policies.get("cuda").with_overrides(fp32=["aten::mm"], remove=["aten::mm"])


def test_failed_override_changes_nothing(device, x):
    base = policies.get("cuda")
    before = (dict(base.categories), dict(base.sources), dict(base.banned_reasons))
    with pytest.raises(ValueError, match="aten::nope"):
        # the valid first entry must not be applied either
        base.with_overrides(fp32=["aten::mm", "aten::nope"])
    with pytest.raises(ValueError, match="no dtype argument"):
        base.with_overrides(fp32_set_opt_dtype=["aten::gelu"])
    assert (dict(base.categories), dict(base.sources), dict(base.banned_reasons)) == before
    assert policies.get("cuda") is base
    with xla_amp.autocast(device, policy="cuda", dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16


def test_single_string_is_refused():
    with pytest.raises(TypeError, match="fp32 must be a list of op names"):
        policies.get("cuda").with_overrides(fp32="aten::mm")


def test_registered_override_selectable_by_name(device, x):
    p = policies.get("cpu").with_overrides(name="cpu-gelu-low",
                                           lower_precision_fp=["aten::gelu"])
    policies.register(p, replace=True)
    with xla_amp.autocast(device, policy="cpu-gelu-low"):
        assert F.gelu(x).dtype == torch.bfloat16


# ---- environment files (read at import: each case in a fresh process) ---------

_PROBE = textwrap.dedent("""
    import json, torch, torch_xla, xla_amp
    import torch.nn.functional as F
    from xla_amp import policies
    d = torch_xla.device()
    x = torch.randn(4, 4).to(d)
    out = {n: {c: list(policies.get(n).ops_in(c)) for c in
               ("lower_precision_fp", "fp32", "promote")}
           for n in ("tpu", "cuda", "cpu", "xpu", "hpu")}
    with xla_amp.autocast(d, policy="cpu"):
        out["gelu"] = str(F.gelu(x).dtype)
        out["mm"] = str((x @ x).dtype)
        out["exp"] = str(torch.exp(x.bfloat16()).dtype)
        out["atan2"] = str(torch.atan2(x.bfloat16(), x).dtype)
    print("RESULT" + json.dumps(out))
""")


def _run(env_files: dict[str, str], tmp_path):
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    for var in ("XLA_AMP_LOWER_PRECISION_OPS_LIST", "XLA_AMP_FP32_OPS_LIST",
                "XLA_AMP_PROMOTE_OPS_LIST"):
        env.pop(var, None)
    for var, text in env_files.items():
        if text is None:
            env[var] = str(tmp_path / "missing.txt")
            continue
        f = tmp_path / f"{var}.txt"
        f.write_text(text)
        env[var] = str(f)
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=300)


def _result(r):
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_env_lists_replace_categories_in_every_policy(tmp_path):
    r = _run({"XLA_AMP_LOWER_PRECISION_OPS_LIST": "# lower\naten::gelu  # GELU in bf16\n\n",
              "XLA_AMP_FP32_OPS_LIST": "aten::exp\naten::mm\n",
              "XLA_AMP_PROMOTE_OPS_LIST": "aten::atan2\n"}, tmp_path)
    out = _result(r)
    for name in ("tpu", "cuda", "cpu", "xpu", "hpu"):
        assert out[name]["lower_precision_fp"] == ["aten::gelu"]
        assert out[name]["fp32"] == ["aten::exp", "aten::mm"]
        assert out[name]["promote"] == ["aten::atan2"]
    assert out["gelu"] == "torch.bfloat16"
    assert out["mm"] == "torch.float32"
    assert out["exp"] == "torch.float32"
    assert out["atan2"] == "torch.float32"


def test_env_one_list_leaves_other_categories(tmp_path):
    out = _result(_run({"XLA_AMP_FP32_OPS_LIST": "aten::exp\n"}, tmp_path))
    assert out["cpu"]["fp32"] == ["aten::exp"]
    assert "aten::mm" in out["cpu"]["lower_precision_fp"]
    assert out["mm"] == "torch.bfloat16" and out["exp"] == "torch.float32"


def test_env_bad_line_names_file_and_line(tmp_path):
    r = _run({"XLA_AMP_FP32_OPS_LIST": "aten::exp\n# c\naten::expp\n"}, tmp_path)
    assert r.returncode != 0
    f = tmp_path / "XLA_AMP_FP32_OPS_LIST.txt"
    assert f"{f}:3: unknown op 'aten::expp'" in r.stderr
    assert "aten::exp" in r.stderr.split("closest known names:")[1]


# The import reads the files through _env_overrides.read_environment (the
# bad-line case above shows its error ending the import): the other refusals
# call that reader in this process, with the environment they name.

def test_env_missing_file_names_it(tmp_path):
    from xla_amp.policies import _env_overrides
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'missing.txt'}: cannot read op list")):
        _env_overrides.read_environment({"XLA_AMP_PROMOTE_OPS_LIST":
                                         str(tmp_path / "missing.txt")})


def test_env_op_in_two_lists_is_refused(tmp_path):
    for var in ("XLA_AMP_LOWER_PRECISION_OPS_LIST", "XLA_AMP_FP32_OPS_LIST"):
        (tmp_path / var).write_text("aten::mm\n")
    from xla_amp.policies import _env_overrides
    with pytest.raises(ValueError, match="aten::mm is listed by both "
                                         "XLA_AMP_LOWER_PRECISION_OPS_LIST"):
        _env_overrides.read_environment({var: str(tmp_path / var) for var in (
            "XLA_AMP_LOWER_PRECISION_OPS_LIST", "XLA_AMP_FP32_OPS_LIST")})
