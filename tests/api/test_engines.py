"""Which engine can run where, and the one line when one cannot
(xla_amp/engines.py): read from the running torch's version and the
installed packages, so the same checks hold in both profiles."""
import pytest
import torch

from xla_amp import engines

pytestmark = pytest.mark.core


@pytest.mark.parametrize("version,runs", [("2.8.0", set()), ("2.9.0", {"privateuse1", "torchax"}),
                                          ("2.15.0+cu132", {"privateuse1", "torchax"}),
                                          ("2.16.0", set())])
def test_torch_ranges(monkeypatch, version, runs):
    monkeypatch.setattr(torch, "__version__", version)
    for name in ("privateuse1", "torchax"):
        reason = engines.problem(name)
        if name in runs:
            assert reason is None or "not installed" in reason, reason
        else:
            assert f"this Python has torch {version}" in reason and "2.9-2.15" in reason
    if version != "2.9.0":
        with pytest.raises(engines.EngineUnavailable,
                           match=r"^feature X needs xla_amp's torch_xla engine, which runs on "
                                 r"torch 2\.9 only"):
            engines.require("torch_xla", "feature X")


def test_privateuse1_engine_refuses_an_unverified_torch_before_anything(monkeypatch):
    from xla_amp.privateuse1 import _install
    if _install.installed_for:
        pytest.skip("installed in this process already")
    monkeypatch.setattr(torch, "__version__", "2.16.0")
    before = set(_install._registered)
    with pytest.raises(ImportError, match="xla_amp.privateuse1 needs xla_amp's privateuse1 "
                                          "engine, which runs on torch 2.9-2.15"):
        _install.install()
    assert set(_install._registered) == before and not _install.installed_for


def test_an_unknown_engine_is_named():
    with pytest.raises(ValueError, match="unknown xla_amp engine 'jaxlib'; engines: torch_xla"):
        engines.problem("jaxlib")
