"""tests.support.faults.Running.wait_cpu, the clock of make faults' seeded
moments: it counts the process's own CPU time, so a process that sleeps
never reaches a moment, one that computes does, and one that ends first
says so."""
import subprocess
import sys
import time

import pytest

from tests.support.faults import Running

SPIN = "import time\nend = time.process_time() + {}\nwhile time.process_time() < end: pass"


def _start(code: str) -> Running:
    return Running(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True))


def test_a_computing_process_reaches_the_moment_on_its_own_clock():
    run = _start(SPIN.format(5.0))
    try:
        before = run.cpu_seconds()
        assert run.wait_cpu(0.5)
        assert run.cpu_seconds() - before >= 0.5
    finally:
        run.p.kill()
        run.finish()


def test_a_sleeping_process_does_not_reach_it():
    run = _start("import time; time.sleep(30)")
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            run.wait_cpu(0.5, timeout=1.0)
        assert time.monotonic() - t0 >= 1.0  # a wall-clock sleep would have said True
    finally:
        run.p.kill()
        run.finish()


def test_a_process_that_ends_first_is_reported():
    run = _start(SPIN.format(0.1))
    assert run.wait_cpu(5.0) is False
    assert run.finish()[0] == 0
