"""The launchers' prepared data kept between runs
(xla_amp_launch/data_cache.py): the digits come back bit for bit from the
file without importing scikit-learn; a damaged file, or one made for
another key, is made again; a cache that cannot be written still gives the
data."""
import os
import subprocess
import sys

import torch

from tests.support import assert_same
from tests.support.launch import ROOT
from xla_amp_launch import data_cache, digits

_LOAD = ("import sys, torch; from xla_amp_launch import digits; d = digits.load_sklearn_digits(); "
         "print('sklearn' in sys.modules, float(d.train_x.sum()), int(d.test_y.sum()))")


def _load_in_a_process(cache: str) -> list[str]:
    env = {**os.environ, "XLA_AMP_CACHE": cache}
    proc = subprocess.run([sys.executable, "-c", _LOAD], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_the_digits_are_made_once_then_read_back_without_sklearn(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    made = _load_in_a_process(cache)
    read = _load_in_a_process(cache)
    assert made[0] == "True" and read[0] == "False"  # the second start skipped the import
    assert made[1:] == read[1:]
    (name,) = os.listdir(cache)
    assert name.startswith("sklearn-digits-") and name.endswith(".pt")
    monkeypatch.setenv("XLA_AMP_CACHE", cache)
    got = digits.load_sklearn_digits()
    want = digits._prepare_sklearn_digits(0.2, 0)
    assert_same({k: getattr(got, k) for k in want}, want, "cached digits")
    assert len(got.train_y) == 1437 and len(got.test_y) == 360


def _counting_make(calls):
    def make():
        calls.append(1)
        return {"x": torch.arange(6.0).reshape(2, 3), "y": torch.tensor([1, 2])}
    return make


def test_a_damaged_or_foreign_file_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_AMP_CACHE", str(tmp_path))
    calls, key = [], {"version": 1}
    first = data_cache.cached("t", key, _counting_make(calls))
    assert_same(data_cache.cached("t", key, _counting_make(calls)), first)
    assert len(calls) == 1
    (path,) = tmp_path.iterdir()
    path.write_bytes(path.read_bytes()[:100])  # truncated, as by a full disk
    assert_same(data_cache.cached("t", key, _counting_make(calls)), first)
    assert len(calls) == 2
    assert_same(data_cache.cached("t", key, _counting_make(calls)), first)  # replaced
    assert len(calls) == 2
    torch.save({"x": torch.zeros(1), "_key": "another key"}, path)  # same name, other data
    assert_same(data_cache.cached("t", key, _counting_make(calls)), first)
    assert len(calls) == 3
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left


def test_a_cache_that_cannot_be_written_still_gives_the_data(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XLA_AMP_CACHE", str(blocker / "cache"))
    calls = []
    for _ in range(2):
        got = data_cache.cached("t", {"version": 1}, _counting_make(calls))
        assert_same(got, _counting_make([])())
    assert len(calls) == 2  # nothing kept, made each time
    assert blocker.read_text() == "not a folder"
