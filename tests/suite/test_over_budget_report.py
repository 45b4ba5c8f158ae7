"""The regrowth guard (issue #53): a test call over the per-test budget is
listed at the end of a `make test` run by name and seconds, slowest first;
setup and teardown do not count, and the run is not failed by it
(tests/conftest.py, pytest_terminal_summary)."""
from tests import conftest


class _Report:
    def __init__(self, nodeid, when, duration):
        self.nodeid, self.when, self.duration = nodeid, when, duration


def test_the_list_names_slow_calls_only():
    reports = [_Report("a", "call", 16.0), _Report("b", "call", 3.0),
               _Report("c", "setup", 40.0), _Report("d", "call", 31.5)]
    assert conftest.over_budget(reports) == [("d", 31.5), ("a", 16.0)]
    assert conftest.TEST_SECONDS == 15.0
