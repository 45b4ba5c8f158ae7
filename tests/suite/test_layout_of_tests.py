"""tests/ is laid out like the package: a folder per xla_amp subpackage (and
per user-facing job: launchers, zoo, ...), no test module outside a folder,
and each make target beyond `make test` is a marker whose tests live in that
target's folder, so that a target is a folder or a marker, never a list of
files (tests/conftest.py holds the mapping)."""
import configparser
import json
import os
import pathlib
import re
import subprocess
import sys

from tests import conftest
from tests.support.launch import ROOT

TESTS = pathlib.Path(conftest.TESTS)
# Marked tests that live elsewhere on purpose: the public-names check of
# tests/api covers every subpackage, the ones that import a framework under
# that framework's marker.
ELSEWHERE = ("tests/api/test_layout.py::test_public_names_and_paths[",)

DUMP = '''
import json, os
def pytest_collection_finish(session):
    with open(os.environ["XLA_AMP_MARKS_OUT"], "w") as f:
        json.dump({i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}, f)
'''


def _every_test_and_its_markers(tmp_path):
    (tmp_path / "dump_marks.py").write_text(DUMP)
    out = tmp_path / "marks.json"
    env = dict(os.environ, PYTHONPATH=str(tmp_path), XLA_AMP_MARKS_OUT=str(out))
    markers = " or ".join(conftest.TARGET_FOLDERS)
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "dump_marks", "-p", "no:xdist", "-m", f"{markers} or not ({markers})",
                           "tests"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_no_test_module_outside_a_folder():
    flat = sorted(p.name for p in TESTS.glob("*.py") if p.name not in {"__init__.py", "conftest.py"})
    assert not flat, flat


def test_every_subpackage_has_its_test_folder():
    pkg = pathlib.Path(ROOT) / "xla_amp"
    subpackages = sorted(p.parent.name for p in pkg.glob("*/__init__.py"))
    missing = [name for name in subpackages if not list((TESTS / name).glob("test_*.py"))]
    assert not missing, missing


def test_each_target_is_a_marker_run_by_make_and_excluded_from_make_test():
    ini = configparser.ConfigParser()
    ini.read(os.path.join(ROOT, "pytest.ini"))
    declared = {line.split(":")[0].strip() for line in ini["pytest"]["markers"].splitlines()
                if line.strip()}
    addopts = ini["pytest"]["addopts"]
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    for marker, folder in conftest.TARGET_FOLDERS.items():
        assert marker in declared, marker
        assert f"not {marker}" in addopts, (marker, addopts)
        assert (TESTS / folder).is_dir(), folder
        assert re.search(rf"-m {marker}\b", makefile), f"no make target runs -m {marker}"
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    ci_targets = set(re.findall(r"^run_target \S+ [\d.]+ (.+)$", ci, re.M))
    ran = {t for line in ci_targets for t in line.split()}
    for target in {"test", "integrations", "sharded", "faults", "torchax", "fp8", "launchers",
                   "zoo", "bazel"}:
        assert target in ran, f".ci/run does not run make {target}"


def test_marked_tests_live_in_their_targets_folder(tmp_path):
    marks = _every_test_and_its_markers(tmp_path)
    assert len(marks) > 2000
    misplaced = []
    for nodeid, names in marks.items():
        if nodeid.startswith(ELSEWHERE):
            continue
        for marker in set(names) & set(conftest.TARGET_FOLDERS):
            if not nodeid.startswith(f"tests/{conftest.TARGET_FOLDERS[marker]}/"):
                misplaced.append((nodeid, marker))
    assert not misplaced, misplaced[:20]
    # the folders that are wholly one target: every test in them carries it
    # and each test carries one target at most (make zoo must not run
    # make zoo-large's DenseNet-121: it once did, 3 more minutes)
    for folder, marker in conftest.FOLDER_TARGETS.items():
        inside = [n for n in marks if n.startswith(f"tests/{folder}/")]
        assert inside, folder
        for n in inside:
            targets = set(marks[n]) & set(conftest.TARGET_FOLDERS)
            assert len(targets) == 1 and (marker in targets or folder == "zoo"), (n, targets)
    both = [n for n, names in marks.items() if len(set(names) & set(conftest.TARGET_FOLDERS)) > 1]
    assert not both, both
