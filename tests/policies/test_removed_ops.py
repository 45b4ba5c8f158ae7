"""Policies per torch version: ops a newer torch removed ([removed_in]),
checked in both profiles (torch 2.9 + torch_xla, and torch 2.15 without it):
the built-in files against the running torch's dispatcher, the loader's
skip and refusals, and the op table generated for the running torch."""
from __future__ import annotations

import pickle
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from xla_amp import policies
from xla_amp.policies._policy import load

from tests.support.policy_files import dispatcher_has, torch_release, write_policy

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[2]
POLICY_DIR = ROOT / "xla_amp" / "policies"
RUNNING = torch_release()
# What native_functions.yaml of each release shows (docs/policies.md,
# "Ops removed by newer torch"): declared in 2.9.0 ... 2.13.0, not in 2.14.0.
REMOVED = {"aten::cholesky": "2.14", "aten::qr": "2.14"}
GONE = "xla_amp_test::retired_op"  # never registered by anything


def _tables(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def _listed(data: dict) -> set[str]:
    return {op for section, entries in data.items() if isinstance(entries, dict)
            and section not in ("sources", "removed_in") for op in entries}


# ---- the built-in files on the running torch ------------------------------------

@pytest.mark.parametrize("path", sorted(POLICY_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_every_entry_exists_here_or_is_marked_removed_by_an_older_release(path):
    """Each op of each file (overload-specific names too) is registered by the
    running torch, or [removed_in] names a release up to this one."""
    data = _tables(path)
    marked = {op: v.get("torch") if isinstance(v, dict) else v
              for op, v in data.get("removed_in", {}).items()}
    missing = sorted(op for op in _listed(data) if not dispatcher_has(op))
    for op in missing:
        assert op in marked, f"{path.name}: {op} is missing from this torch and not in [removed_in]"
        major, minor = (int(x) for x in marked[op].split(".")[:2])
        assert (major, minor) <= RUNNING, (op, marked[op])


@pytest.mark.parametrize("name", policies.builtin_names())
def test_builtin_policy_loads_and_records_what_it_left_out(name):
    """policies.get works on this torch; what the file marks removed is used
    where this torch has it and recorded in skipped_ops where it does not."""
    p = policies.get(name)
    data = _tables(POLICY_DIR / f"{name}.toml")
    marked = {op: v["torch"] for op, v in data.get("removed_in", {}).items()}
    assert dict(p.removed_in) == marked
    assert dict(p.skipped_ops) == {op: v for op, v in marked.items() if not dispatcher_has(op)}
    for op, version in marked.items():
        if dispatcher_has(op):
            assert op in p.categories or op in p.uncast, op
        else:
            assert op not in p.categories and op not in p.uncast, op
    assert set(p.expanded())  # every remaining entry expands on this torch


@pytest.mark.parametrize("name", ["cpu", "tpu"])
def test_cholesky_and_qr_per_torch_release(name):
    """torch <= 2.13 (2.9 here): listed and used, nothing skipped; torch >=
    2.14 (2.15 in the current profile): both left out, with their release."""
    p = policies.get(name)
    assert dict(p.removed_in) == REMOVED
    if RUNNING < (2, 14):
        assert dict(p.skipped_ops) == {}
        assert p.category("aten::cholesky") == "fp32" and p.category("aten::qr") == "fp32"
    else:
        assert dict(p.skipped_ops) == REMOVED
        assert not set(REMOVED) & set(p.categories)


def test_removed_in_entries_cite_a_listed_source():
    for path in sorted(POLICY_DIR.glob("*.toml")):
        data = _tables(path)
        for op, value in data.get("removed_in", {}).items():
            assert isinstance(value, dict) and set(value) == {"torch", "source"}, (path.name, op)
            key = value["source"].split(":")[0]
            assert "https://" in data["sources"][key], (path.name, op, key)


# ---- the loader -----------------------------------------------------------------

def test_never_existing_op_is_refused_with_file_line_and_near_names(tmp_path):
    f = write_policy(tmp_path, '[fp32]\n"aten::mm" = "x"\n"aten::choleskyy" = "x"\n'
                               '[removed_in]\n"aten::mm" = "2.0"\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(f))}:6: unknown op "
                                         r"'aten::choleskyy'; closest known names: .*"
                                         r"aten::cholesky_solve"):
        load(f)


@pytest.mark.parametrize("later", ["99.0", f"{RUNNING[0]}.{RUNNING[1] + 1}"])
def test_missing_op_marked_removed_by_a_later_release_is_refused(tmp_path, later):
    """The record is wrong: this torch predates the release said to remove it."""
    f = write_policy(tmp_path, f'[fp32]\n"{GONE}" = "x"\n\n[removed_in]\n'
                               f'"{GONE}" = {{ torch = "{later}", source = "x" }}\n')
    with pytest.raises(ValueError) as e:
        load(f)
    message = str(e.value)
    assert message.startswith(f"{f}:8: [removed_in] says torch {later} removed {GONE}, "
                              "but the running torch "), message
    assert "is older and lacks it already (the record is wrong)" in message
    assert "\n" not in message


@pytest.mark.parametrize("version", ["2.0", "2.9.0", f"{RUNNING[0]}.{RUNNING[1]}"])
def test_missing_op_removed_by_an_older_release_is_left_out_and_recorded(tmp_path, version):
    """The skip path on any torch: an op nothing registers, marked removed by a
    release up to the running one (equal included), in a category and in
    [uncast]; the rest of the file loads."""
    gone_too = GONE + "_too"
    f = write_policy(tmp_path, f'[fp32]\n"aten::exp" = "x"\n"{GONE}" = "x"\n'
                               f'[uncast]\n"{gone_too}" = "x"\n'
                               f'[removed_in]\n"{GONE}" = {{ torch = "{version}", source = "x" }}\n'
                               f'"{gone_too}" = "{version}"\n')
    p = load(f)
    assert dict(p.categories) == {"aten::exp": "fp32"} and dict(p.uncast) == {}
    assert dict(p.skipped_ops) == {GONE: version, gone_too: version}
    assert dict(p.removed_in) == dict(p.skipped_ops)
    assert p.category("aten::exp") == "fp32"
    again = pickle.loads(pickle.dumps(p))
    assert dict(again.skipped_ops) == dict(p.skipped_ops)
    derived = p.with_overrides(lower_precision_fp=["aten::mm"])
    assert dict(derived.skipped_ops) == dict(p.skipped_ops)


def test_op_marked_removed_but_present_is_used(tmp_path):
    f = write_policy(tmp_path, '[lower_precision_fp]\n"aten::mm" = "x"\n'
                               '[removed_in]\n"aten::mm" = { torch = "2.0", source = "x" }\n')
    p = load(f)
    assert p.category("aten::mm") == "lower_precision_fp"
    assert dict(p.skipped_ops) == {} and dict(p.removed_in) == {"aten::mm": "2.0"}


@pytest.mark.parametrize("entry,error", [
    ('"aten::mm" = "soon"', r":8: \[removed_in\] aten::mm = 'soon' is not a torch release"),
    ('"aten::mm" = { source = "x" }', r":8: \[removed_in\] aten::mm = .* is not a torch release"),
    ('"aten::exp" = "2.0"', r":8: \[removed_in\] names aten::exp, which no table of this file"),
])
def test_bad_removed_in_entries_name_their_line(tmp_path, entry, error):
    f = write_policy(tmp_path, f'[fp32]\n"aten::mm" = "x"\n\n[removed_in]\n{entry}\n')
    with pytest.raises(ValueError, match=re.escape(str(f)) + error):
        load(f)


# ---- the op table of the running torch ------------------------------------------

def test_op_tables_up_to_date():
    """scripts/gen_op_tables.py --check for this profile's torch
    (docs/op_tables.md under 2.9, docs/op_tables_torch2.15.md under 2.15)."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_op_tables.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_op_table_of_this_torch_shows_the_removed_ops():
    name = "op_tables.md" if RUNNING == (2, 9) else f"op_tables_torch{RUNNING[0]}.{RUNNING[1]}.md"
    text = (ROOT / "docs" / name).read_text()
    for op, version in REMOVED.items():
        state = "present: used as listed" if RUNNING < (2, 14) else "missing: left out"
        assert f"| `{op}` | {version} | cpu, tpu | {state} |" in text
        assert (f"| `{op}` | fp32 |" in text) == (RUNNING < (2, 14))
