"""The regrowth guard: a test call over the per-test budget is
listed at the end of a `make test` run by name and seconds, slowest first;
setup and teardown do not count, and the run is not failed by it
(tests/conftest.py, pytest_terminal_summary); .ci/run's per-target times
start their own lines."""
import os
import re
import subprocess

from tests import conftest
from tests.support.launch import ROOT


class _Report:
    def __init__(self, nodeid, when, duration):
        self.nodeid, self.when, self.duration = nodeid, when, duration


def test_the_list_names_slow_calls_only():
    reports = [_Report("a", "call", 16.0), _Report("b", "call", 3.0),
               _Report("c", "setup", 40.0), _Report("d", "call", 31.5)]
    assert conftest.over_budget(reports) == [("d", 31.5), ("a", 16.0)]
    assert conftest.TEST_SECONDS == 15.0


def _ci_run_target():
    """.ci/run's text and its run_target function."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        text = f.read()
    return text, re.search(r"^run_target\(\) \{.*?^\}$", text, re.S | re.M).group(0)


def test_ci_prints_each_targets_time_on_a_line_of_its_own():
    """.ci/run's per-target line starts a line even when the target's last
    output lacked its newline (the current profile's exit, Triton's
    nanobind leak report): `^=== ci:` finds every target."""
    _, func = _ci_run_target()
    script = ("timeout() { shift 3; \"$@\"; }\n"  # timeout -k 30 SECONDS make ...
              "make() { printf 'no newline at the end'; }\nSUMMARY=''\n" + func
              + "\nrun_target current 4 current\n")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         timeout=30).stdout
    assert re.search(r"^=== ci: current +0:00  \(budget  4:00\)$", out, re.M), out


def test_ci_stops_a_target_at_its_deadline_naming_it(tmp_path):
    """A hung target ends .ci/run at the deadline, before CI's own stop,
    with its line and its name; the targets after it do not start."""
    text, func = _ci_run_target()
    assert re.search(r"^DEADLINE=\$\(\(87 \* 60\)\)$", text, re.M)  # CI stops at 90
    (tmp_path / "mk").write_text("hang:\n\tsleep 60\n")
    script = ("START=$SECONDS\nDEADLINE=2\nSUMMARY=''\n" + func
              + f"\nrun_target hung 1 -f {tmp_path / 'mk'} hang\necho after\n")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 124, proc.stdout + proc.stderr
    assert re.search(r"^=== ci: hung +0:0[23]  \(budget  1:00\)$", proc.stdout, re.M), proc.stdout
    assert "=== ci: hung stopped at the deadline, 2 s after the start" in proc.stdout
    assert "after" not in proc.stdout.splitlines()[-1]
