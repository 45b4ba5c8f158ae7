"""autocast as a context manager: state, nesting, threads, eligibility, cache."""
import re
import threading
import warnings

import pytest
import torch
import torch_xla

import xla_amp
from xla_amp import _C, autocast, policies


def hlo(*tensors):
    return torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))


@pytest.fixture
def mats(device):
    torch.manual_seed(0)
    return torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)


def test_reports_state_through_torch(device):
    assert not torch.is_autocast_enabled("xla")
    with autocast(device, policy="tpu"):
        assert torch.is_autocast_enabled("xla")
        assert torch.get_autocast_dtype("xla") == torch.bfloat16
        assert _C.active_policy_name() == "tpu"
    assert not torch.is_autocast_enabled("xla")
    assert _C.policy_depth() == 0


def test_is_a_torch_autocast(device):
    assert isinstance(autocast(device, policy="tpu"), torch.amp.autocast)


def test_string_device(device):
    with autocast("xla:0", policy="tpu") as ac:
        assert torch.is_autocast_enabled("xla")
    assert ac.xla_device == torch.device("xla:0")


def test_enabled_false_inside(device, mats):
    a, b = mats
    with autocast(device, policy="tpu"):
        with autocast(device, enabled=False, policy="tpu"):
            assert not torch.is_autocast_enabled("xla")
            assert torch.mm(a, b).dtype == torch.float32
        assert torch.mm(a, b).dtype == torch.bfloat16


def test_nested_policies_restore(device, mats):
    a, b = mats
    mm_fp32 = policies.get("tpu").with_overrides(name="tpu-mm-fp32", fp32=["aten::mm"])
    with autocast(device, policy="tpu"):
        assert torch.mm(a, b).dtype == torch.bfloat16
        with autocast(device, policy=mm_fp32):
            assert _C.active_policy_name() == "tpu-mm-fp32"
            assert torch.mm(a.bfloat16(), b).dtype == torch.float32
        assert _C.active_policy_name() == "tpu"
        assert torch.mm(a, b).dtype == torch.bfloat16


def test_decorator(device, mats):
    a, b = mats

    @autocast(device, policy="tpu")
    def forward(x, y):
        return torch.mm(x, y), torch.is_autocast_enabled("xla")

    out, enabled = forward(a, b)
    assert enabled and out.dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("xla")


def test_exception_restores_state(device):
    with pytest.raises(KeyError):
        with autocast(device, policy="tpu"):
            raise KeyError("boom")
    assert not torch.is_autocast_enabled("xla")
    assert _C.policy_depth() == 0


def test_state_is_per_thread(device, mats):
    a, b = mats
    seen = {}

    def worker():
        seen["enabled"] = torch.is_autocast_enabled("xla")
        seen["dtype"] = torch.mm(a, b).dtype
        with autocast(device, policy="tpu"):
            seen["inner"] = torch.mm(a, b).dtype

    with autocast(device, policy="tpu"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert torch.mm(a, b).dtype == torch.bfloat16
    assert seen == {"enabled": False, "dtype": torch.float32, "inner": torch.bfloat16}


def test_float64_and_integer_untouched(device, mats):
    a, b = mats
    with autocast(device, policy="tpu"):
        assert torch.mm(a.double(), b.double()).dtype == torch.float64
        assert torch.mm(a.long(), b.long()).dtype == torch.int64
        assert torch.log_softmax(a.double(), 1).dtype == torch.float64


def test_inplace_and_out_are_not_autocast(device, mats):
    a, b = mats
    acc = torch.zeros(4, 4, device=device)
    out = torch.empty(4, 4, device=device)
    with autocast(device, policy="tpu"):
        acc.addmm_(a, b)
        torch.mm(a, b, out=out)
    for t in (acc, out):
        assert t.dtype == torch.float32
        assert "bf16" not in hlo(t)  # no cast happened on the way
    assert torch.equal(out.cpu(), torch.mm(a, b).cpu())


def test_explicit_dtype_is_respected(device, mats):
    a, _ = mats
    with autocast(device, policy="tpu"):
        assert torch.softmax(a.bfloat16(), 1).dtype == torch.float32
        assert torch.softmax(a, 1, dtype=torch.bfloat16).dtype == torch.bfloat16
        assert torch.log_softmax(a, 1, dtype=torch.float64).dtype == torch.float64


def test_backward_runs_in_forward_dtype(device):
    torch.manual_seed(0)
    x = torch.randn(8, 4, device=device)
    lin = torch.nn.Linear(4, 3).to(device)
    with autocast(device, policy="tpu"):
        y = lin(x)
        loss = y.float().pow(2).sum()
    assert y.dtype == torch.bfloat16
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32  # grads of fp32 leaves stay fp32
    text = hlo(lin.weight.grad)
    assert re.search(r"bf16\[[\d,]*\]\{[\d,]*\} dot\(", text), "backward matmul is not bf16"


def _weight_converts(text):
    return len(re.findall(r"bf16\[4,6\]\{1,0\} convert\(f32\[4,6\]", text))


def test_cache_casts_each_weight_once_per_region(device):
    torch.manual_seed(0)
    w = torch.randn(4, 6, device=device, requires_grad=True)  # a weight: leaf, grad
    xs = [torch.randn(3, 4, device=device).bfloat16() for _ in range(3)]
    with autocast(device, policy="tpu"):
        ys = [torch.mm(x, w) for x in xs]
    assert _weight_converts(hlo(*ys)) == 1
    with autocast(device, policy="tpu", cache_enabled=False):
        ys = [torch.mm(x, w) for x in xs]
    assert _weight_converts(hlo(*ys)) == 3
    # The cache dies with the outermost region: a new region casts again.
    with autocast(device, policy="tpu"):
        y1 = torch.mm(xs[0], w)
    with autocast(device, policy="tpu"):
        y2 = torch.mm(xs[0], w)
    assert _weight_converts(hlo(y1, y2)) == 2


def test_non_xla_device_raises_naming_it():
    with pytest.raises(ValueError, match="'cpu'"):
        autocast("cpu", policy="tpu")
    with pytest.raises(ValueError, match="cuda:1"):
        autocast(torch.device("cuda:1"))


def test_unsupported_dtype_warns_once_and_disables(device, mats):
    a, b = mats
    from xla_amp import autocast as autocast_module
    autocast_module_state = __import__("xla_amp.engines._arguments", fromlist=["_warned"])
    autocast_module_state._warned.discard(("tpu", torch.float16))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with autocast_module(device, dtype=torch.float16, policy="tpu"):
            assert not torch.is_autocast_enabled("xla")
            assert torch.mm(a, b).dtype == torch.float32
        with autocast_module(device, dtype=torch.float16, policy="tpu"):
            pass
    msgs = [str(w.message) for w in caught if "does not support" in str(w.message)]
    assert len(msgs) == 1 and "float16" in msgs[0] and "tpu" in msgs[0]


def test_unknown_policy_lists_valid_names(device):
    with pytest.raises(ValueError, match="unknown autocast policy 'tpv'.*tpu"):
        autocast(device, policy="tpv")


def test_set_default_policy_public(device):
    """xla_amp.set_default_policy: what plain torch.autocast("xla") uses."""
    a = torch.randn(4, 4, device=device)
    try:
        xla_amp.set_default_policy("cuda")
        with torch.autocast("xla", dtype=torch.bfloat16):
            # cuda: log_softmax is fp32 (cpu rules leave it alone)
            assert torch.log_softmax(a.bfloat16(), -1).dtype == torch.float32
        xla_amp.set_default_policy(xla_amp.policies.get("cpu"))
        with torch.autocast("xla", dtype=torch.bfloat16):
            assert torch.log_softmax(a.bfloat16(), -1).dtype == torch.bfloat16
        with pytest.raises(TypeError, match="int"):
            xla_amp.set_default_policy(3)
        with pytest.raises(ValueError, match="'nope'"):
            xla_amp.set_default_policy("nope")
        with torch.autocast("xla", dtype=torch.bfloat16):  # unchanged by the refusals
            assert torch.log_softmax(a.bfloat16(), -1).dtype == torch.bfloat16
    finally:
        xla_amp.set_default_policy(None)
    assert "set_default_policy" in xla_amp.__all__


def test_recursive_decorator_restores_state(device, mats):
    """One region object entered again before it exits (a decorated
    recursive function): each exit restores what its own enter saw."""
    a, b = mats
    seen = []

    @autocast(device, policy="tpu")
    def descend(depth):
        seen.append((torch.is_autocast_enabled("xla"), _C.policy_depth(), torch.mm(a, b).dtype))
        if depth:
            descend(depth - 1)
        seen.append((torch.is_autocast_enabled("xla"), _C.policy_depth()))

    descend(2)
    assert [s[:2] for s in seen] == [(True, 1), (True, 2), (True, 3), (True, 3), (True, 2),
                                     (True, 1)]
    assert {s[2] for s in seen if len(s) == 3} == {torch.bfloat16}
    assert not torch.is_autocast_enabled("xla")
    assert _C.policy_depth() == 0
    assert torch.get_autocast_dtype("xla") == torch.bfloat16  # torch's default for xla


def test_rebuilt_region_checks_its_arguments_again(device, mats):
    """Regions are built once per argument set; an equal-but-different
    argument (enabled=1 after enabled=True) is still refused, and a policy
    registered again under a name takes effect for new regions."""
    a, b = mats
    with autocast(device, enabled=True, policy="tpu"):
        pass
    with pytest.raises(ValueError, match="enabled must be a bool, got 1"):
        autocast(device, enabled=1, policy="tpu")
    with pytest.raises(ValueError, match="cache_enabled must be a bool, got 1"):
        autocast(device, cache_enabled=1, policy="tpu")
    first = policies.get("tpu").with_overrides(name="rebuilt-test", fp32=["aten::mm"])
    second = policies.get("tpu").with_overrides(name="rebuilt-test")
    policies.register(first, replace=True)
    with autocast(device, policy="rebuilt-test"):
        assert torch.mm(a, b).dtype == torch.float32
    policies.register(second, replace=True)
    with autocast(device, policy="rebuilt-test") as region:
        assert torch.mm(a, b).dtype == torch.bfloat16
    assert region.policy is second


def test_export_records_the_region(device):
    """torch.export's pre-dispatch trace sees the region as torch.autocast's
    (a wrap_with_autocast node), and leaves no state behind."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            with autocast(device, policy="tpu"):
                y = self.fc(x)
            return y.relu()

    ep = torch.export.export(Net(), (torch.randn(2, 4),))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "wrap_with_autocast" in targets
    assert not torch.is_autocast_enabled("xla") and _C.policy_depth() == 0
