"""The engine seam (xla_amp/engines/): which engine can run where and the
one line when one cannot (read from the running torch's version and the
installed packages, so the same checks hold in both profiles); the one
place that picks an engine for a device; every engine implementing the
whole interface."""
import pickle

import pytest
import torch

import xla_amp
from xla_amp import engines
from xla_amp.engines._base import HOOKS, Implementation

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


def test_for_device_picks_each_engine():
    assert engines.for_device("xla:0").name == "torch_xla"
    assert engines.for_device(torch.device("xla", 1)).name == "torch_xla"
    assert engines.for_device("jax").name == "torchax"
    with pytest.raises(ValueError, match=r"^xla_amp: no xla_amp engine serves device 'cuda:0'; "
                                         r"engines: torch_xla \(xla: pip install torch==2\.9\.0.*"
                                         r"privateuse1 \((no device yet|tpu): .*torch-tpu.*"
                                         r"torchax \(jax: pip install torchax==0\.0\.13"):
        engines.for_device("cuda:0")
    with pytest.raises(ValueError, match=r"^autocast: no xla_amp engine serves device 'cpu'"):
        xla_amp.autocast("cpu")
    with pytest.raises(ValueError, match=r"is not a device"):
        engines.for_device(3.5)


def test_engines_pickle_as_themselves():
    """A module under module_policies holds its engine: the engine pickles by
    name and comes back as the registry's own object."""
    for engine in engines.ENGINES.values():
        assert pickle.loads(pickle.dumps(engine)) is engine


@pytest.mark.parametrize("name", ["torch_xla", "privateuse1"])  # torchax's: tests/torchax
def test_each_engine_implements_every_hook(name):
    assert_implements_every_hook(engines.get(name))


def assert_implements_every_hook(engine):
    if not engine.available():
        pytest.skip(engine.problem())
    implementation = engine.implementation()
    assert isinstance(implementation, Implementation) and implementation.engine is engine
    own = {h for h in HOOKS if getattr(type(implementation), h) is not getattr(Implementation, h)}
    abstract = {"region_class", "compile", "active", "push", "pop", "active_dtype"}
    assert abstract <= own, sorted(abstract - own)
