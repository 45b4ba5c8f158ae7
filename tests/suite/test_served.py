"""tests/support/served.py: one long-lived process per worker answers each
call with what main(argv) printed; errors and a dead process come back as
ServedError naming them, and the next call starts a fresh process."""
import os

import pytest

from tests.support.served import ServedError, served

MODULE = "tests.suite._served_sample"


def test_calls_share_one_process_and_pytest_variables_do_not_split_it(monkeypatch):
    first = served(MODULE, dict(os.environ)).call(["a", "b"], timeout=60)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # pytest sets it per test
    second = served(MODULE, dict(os.environ)).call(["c"], timeout=60)
    (a, pid1), (c, pid2) = first.rsplit(" ", 1), second.rsplit(" ", 1)
    assert (a, c) == ("a b", "c") and pid1 == pid2


def test_an_error_names_itself_and_the_process_goes_on():
    server = served(MODULE, dict(os.environ))
    with pytest.raises(ServedError, match="ValueError: asked to raise"):
        server.call(["raise"], timeout=60)
    assert server.call(["ok"], timeout=60).startswith("ok ")


def test_a_dead_process_is_reported_and_replaced():
    server = served(MODULE, dict(os.environ))
    with pytest.raises(ServedError, match="the server ended .exit 3"):
        server.call(["die"], timeout=60)
    assert served(MODULE, dict(os.environ)).call(["back"], timeout=60).startswith("back ")
