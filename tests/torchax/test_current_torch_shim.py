"""xla_amp/torchax/_compat.py, pinned: torchax 0.0.13 imports on torch 2.15
only because the shim skips the 23 ops and overloads torch removed that
torchax names (26 places). The exact list is recorded per torch minor
version; a new torch, a new torchax, or a torchax that no longer needs the
shim fails here. Runs in both profiles (torch 2.9 + torch_xla: nothing is
skipped and torchax registers exactly what it registers without the shim)."""
from __future__ import annotations

import pytest
import torch

from tests.support import torchax_current as cur
from xla_amp.torchax import _compat, _pins

pytestmark = [pytest.mark.torchax, pytest.mark.core]

# (torch major, minor) -> {name: torchax's places} for torchax 0.0.13
RECORDED = {
    (2, 9): {},
    (2, 15): {
        "aten.all.dimname": ["torchax.decompositions:357"],
        "aten.all.dimname_out": ["torchax.decompositions:358"],
        "aten.cholesky": ["torchax.amp:131", "torchax.ops.jaten:206"],
        "aten.index_add.dimname": ["torchax.decompositions:472"],
        "aten.index_copy.dimname": ["torchax.amp:217", "torchax.decompositions:475"],
        "aten.index_copy_.dimname": ["torchax.decompositions:478"],
        "aten.index_fill.Dimname_Scalar": ["torchax.decompositions:481"],
        "aten.index_fill.Dimname_Tensor": ["torchax.decompositions:482"],
        "aten.index_fill_.Dimname_Scalar": ["torchax.decompositions:487"],
        "aten.index_fill_.Dimname_Tensor": ["torchax.decompositions:488"],
        "aten.norm.names_ScalarOpt_dim": ["torchax.decompositions:592"],
        "aten.norm.names_ScalarOpt_dim_dtype": ["torchax.decompositions:599"],
        "aten.norm.names_dtype_out": ["torchax.decompositions:600"],
        "aten.norm.names_out": ["torchax.decompositions:601"],
        "aten.prod.dim_Dimname": ["torchax.amp:118"],
        "aten.qr": ["torchax.amp:199", "torchax.ops.jaten:5100"],
        "aten.std.correction_names": ["torchax.decompositions:708"],
        "aten.std.correction_names_out": ["torchax.decompositions:709"],
        "aten.std.names_dim": ["torchax.decompositions:704"],
        "aten.std.names_out": ["torchax.decompositions:705"],
        "aten.std_mean.correction_names": ["torchax.decompositions:714"],
        "aten.std_mean.names_dim": ["torchax.decompositions:713"],
        "aten.unbind.Dimname": ["torchax.decompositions:742"],
    },
}
# where the placeholders were registered (the decompositions' list is
# filtered by torch._decomp.get_decompositions itself)
REMOVED = {(2, 9): {}, (2, 15): {"torchax.amp.autocast_policy": 4,
                                 "torchax.ops.ops_registry.all_aten_ops": 2}}
PLAIN_ERROR = {(2, 15): "AttributeError: The underlying op of 'aten.prod' has no overload "
                        "name 'dim_Dimname'"}


@pytest.fixture(scope="module")
def shim():
    return cur.registry_in_fresh_process("shim")


@pytest.fixture(scope="module")
def plain():
    return cur.registry_in_fresh_process("plain")


def _recorded(table):
    if cur.torch_minor() not in table:
        pytest.fail(f"torch {torch.__version__} is not recorded: run the shim there and record "
                    f"what it skips (xla_amp/torchax/_pins.py verifies 2.9 to 2.15)")
    return table[cur.torch_minor()]


def test_the_shim_skips_exactly_the_recorded_names(shim):
    assert shim["imported"] == list(_compat.MODULES)  # the shim imported torchax itself
    assert shim["skipped"] == _recorded(RECORDED)
    assert shim["removed"] == _recorded(REMOVED)
    assert shim["getattr_restored"] == [True, True]
    assert len(shim["skipped"]) == (23 if cur.torch_minor() == (2, 15) else 0)


def test_torchax_alone_fails_or_registers_the_same(shim, plain):
    """torch 2.15: torchax's own import still fails (when it stops failing,
    torchax no longer needs the shim). torch 2.9: the shim changes nothing."""
    want_error = PLAIN_ERROR.get(cur.torch_minor())
    assert plain.get("error") == want_error
    if want_error is None:
        for key in ("aten_ops", "torch_functions", "autocast_policy", "decompositions",
                    "env_ops", "env_decomps"):
            assert shim[key] == plain[key], key
    for key in ("aten_ops", "autocast_policy", "decompositions"):
        assert not [n for n in shim[key] if "skipped" in n or "Skipped" in n], key
    skipped = set(shim["skipped"])
    assert not {n.split("=")[0] for n in shim["autocast_policy"]} & skipped


def test_this_process_skipped_what_a_fresh_one_did(shim):
    if "torchax" in _compat._state["imported"]:  # else torchax came first (torch_xla)
        assert _compat.skipped_sites() == shim["skipped"]
    assert _compat.skipped_names() == sorted(shim["skipped"])


def _in_torchax(code: str, **names):
    """Runs `code` as if in a torchax module (the shim's site check)."""
    scope = {"__name__": "torchax.fake", "torch": torch, **names}
    exec(compile(code, "torchax/fake.py", "exec"), scope)
    return scope


def test_the_window_is_narrow():
    record = []
    with _compat.window(record):
        got = _in_torchax("a = torch.ops.aten.prod.no_such_overload\n"
                          "b = torch.ops.aten.no_such_op.default\n"
                          "c = torch.ops.aten.prod.dim_int")
        a, b = got["a"], got["b"]
        assert isinstance(a, _compat.Skipped) and a.name == "aten.prod.no_such_overload"
        assert isinstance(b, _compat.Skipped) and b.name == "aten.no_such_op.default"
        assert got["c"] is torch.ops.aten.prod.dim_int  # a real overload is untouched
        assert record == [("aten.prod.no_such_overload", "torchax.fake:1"),
                          ("aten.no_such_op", "torchax.fake:2")]
        for code in ("torch.ops.aten.prod.__no_such__",     # a dunder
                     "torch.ops.no_such_ns.op",             # not aten
                     "torch.ops.aten.__no_such__"):
            with pytest.raises(AttributeError):
                _in_torchax(code)
        with pytest.raises(AttributeError):                 # not from torchax
            torch.ops.aten.prod.no_such_overload
        with pytest.raises(ZeroDivisionError):              # other errors propagate
            _in_torchax("torch.ops.aten.prod.default; 1 / 0")
    assert len(record) == 2
    for cls in (torch._ops.OpOverloadPacket, torch._ops._OpNamespace):
        assert cls.__dict__["__getattr__"].__module__ == "torch._ops"  # restored
    with pytest.raises(AttributeError):
        _in_torchax("torch.ops.aten.prod.no_such_overload")


def test_an_existing_overload_that_fails_is_not_skipped():
    """An AttributeError for an overload torch has (some other failure) propagates."""
    def broken(self, key):
        raise AttributeError("something else")
    wrapped = _compat._packet_getattr(broken, record := [])
    with pytest.raises(AttributeError, match="something else"):
        _in_torchax("w(torch.ops.aten.prod, 'dim_int')", w=wrapped)
    assert record == []


@pytest.mark.parametrize("version", ["2.9.0", "2.13.0", "2.15.0+cu132", "2.15.1"])
def test_pins_accept_the_verified_range(version):
    _pins.check(version, "0.0.13")


@pytest.mark.parametrize("torch_version,torchax_version,match", [
    ("2.16.0", "0.0.13", "torch 2.16.0 is not supported: torchax 0.0.13 is verified with "
                         r"torch 2.9 to 2.15$"),
    ("2.8.0", "0.0.13", "torch 2.8.0 is not supported"),
    ("2.15.0", "0.0.14", "torchax 0.0.14 is installed, 0.0.13 is needed$"),
    ("2.15.0", "0.0.6", "0.0.6 is the copy torch_xla 2.9.0's wheel carries"),
    ("2.15.0", None, "needs torchax==0.0.13"),
])
def test_pins_refuse_with_one_line(torch_version, torchax_version, match):
    with pytest.raises(ImportError, match=match) as info:
        _pins.check(torch_version, torchax_version)
    assert "\n" not in str(info.value)
