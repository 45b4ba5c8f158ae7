"""tests/support/runs.py: a result several tests read is computed once per
test run, by whichever process asks first, even when two processes ask at
the same moment (as two xdist workers do); a failed computation is not kept."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.launch import ROOT
from tests.support.runs import RUN_DIR_VAR, once_per_run

ASK = """
import json, os, sys, time
from tests.support.runs import once_per_run
def compute():
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(1.0)  # long enough for the other process to ask meanwhile
    return {"made_by": os.getpid()}
print(json.dumps(once_per_run(("probe", 1), compute)))
"""


def test_two_processes_asking_at_once_compute_it_once(tmp_path):
    env = dict(os.environ, **{RUN_DIR_VAR: str(tmp_path / "run")})
    log = tmp_path / "computed"
    procs = [subprocess.Popen([sys.executable, "-c", ASK, str(log)], stdout=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(log.read_text().split()) == 1  # computed once
    assert outs[0] == outs[1]                 # both read that one result


def test_a_failed_computation_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_DIR_VAR, str(tmp_path))
    calls = []

    def fails():
        calls.append(1)
        raise AssertionError("the run failed")
    for _ in range(2):
        with pytest.raises(AssertionError, match="the run failed"):
            once_per_run(("failing",), fails)
    assert len(calls) == 2
    assert once_per_run(("failing",), lambda: {"ok": 1}) == {"ok": 1}
    assert once_per_run(("failing",), lambda: {"ok": 2}) == {"ok": 1}


def test_this_run_has_its_own_folder_under_build():
    folder = os.environ[RUN_DIR_VAR]
    assert os.path.dirname(folder) == os.path.join(ROOT, "build", "test-runs")
    assert os.path.isdir(folder)
