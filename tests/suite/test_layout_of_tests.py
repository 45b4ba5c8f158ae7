"""tests/ is laid out like the package: a folder per xla_amp subpackage (and
per user-facing job: launchers, zoo, ...), no test module outside a folder,
and each make target beyond `make test` is a marker whose tests live in that
target's folder, so that a target is a folder or a marker, never a list of
files (tests/conftest.py holds the mapping)."""
import ast
import configparser
import json
import os
import pathlib
import re
import subprocess
import sys

from tests import conftest
from tests.support.launch import ROOT, nested_pytest_env

TESTS = pathlib.Path(conftest.TESTS)
# Marked tests that live elsewhere on purpose: the public-names check of
# tests/api covers every subpackage, the ones that import a framework under
# that framework's marker.
ELSEWHERE = ("tests/api/test_layout.py::test_public_names_and_paths[",)

class Unreadable(Exception):
    """A target marker written where the static reading cannot place it."""


def _target_of(node) -> str | None:
    """`X` for an expression ``pytest.mark.X`` / ``pytest.mark.X(...)`` naming a target."""
    if isinstance(node, ast.Call):
        node = node.func
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark" and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "pytest" and node.attr in conftest.TARGET_FOLDERS):
        return node.attr
    return None


def _targets_in(node) -> set[str]:
    return {t for n in ast.walk(node) for t in [_target_of(n)] if t}


def _param_marks(decorators) -> list[set[str]]:
    """The target markers of each pytest.param(..., marks=...) in `decorators`."""
    out = []
    for n in (n for d in decorators for n in ast.walk(d)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr == "param"):
            out += [_targets_in(k.value) for k in n.keywords if k.arg == "marks"]
    return out


def _pytestmark(body) -> set[str]:
    return {t for st in body if isinstance(st, ast.Assign)
            and any(isinstance(x, ast.Name) and x.id == "pytestmark" for x in st.targets)
            for t in _targets_in(st.value)}


def _file_tests(path: pathlib.Path) -> dict[str, list[set[str]]]:
    """test name -> the target-marker sets its nodes can carry, read from the
    source (module and class pytestmark, decorators, pytest.param marks);
    Unreadable for a target marker anywhere else."""
    tree = ast.parse(path.read_text(), str(path))
    placed = set()
    module = _pytestmark(tree.body)
    out = {}

    def visit_function(fn, outer: set[str], prefix: str):
        base = outer | {t for d in fn.decorator_list for t in [_target_of(d)] if t}
        params = _param_marks(fn.decorator_list)
        out[prefix + fn.name] = [base] + [base | p for p in params if p]
        placed.update(id(n) for d in fn.decorator_list for n in ast.walk(d))

    for st in tree.body:
        if isinstance(st, ast.Assign) and _pytestmark([st]):
            placed.update(id(n) for n in ast.walk(st))
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name.startswith("test"):
            visit_function(st, module, "")
        elif isinstance(st, ast.ClassDef) and st.name.startswith("Test"):
            cls = module | _pytestmark(st.body) | {t for d in st.decorator_list
                                                   for t in [_target_of(d)] if t}
            placed.update(id(n) for d in st.decorator_list for n in ast.walk(d))
            placed.update(id(n) for b in st.body if isinstance(b, ast.Assign) and _pytestmark([b])
                          for n in ast.walk(b))
            for fn in st.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        fn.name.startswith("test"):
                    visit_function(fn, cls, st.name + "::")
    stray = [n for n in ast.walk(tree) if _target_of(n) and id(n) not in placed]
    if stray:
        raise Unreadable(f"{path}:{stray[0].lineno}: a target marker outside a pytestmark or "
                         "a test's decorators: write it there")
    return out


def _every_test_and_its_markers() -> dict[str, list[set[str]]]:
    """nodeid-like "tests/<folder>/<file>::<test>" -> its target-marker sets,
    the folder's own target added where a node names none (conftest's rule)."""
    out = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(TESTS.parent).as_posix()
        folder = conftest.folder_of(path)
        for name, sets in _file_tests(path).items():
            target = conftest.FOLDER_TARGETS.get(folder)
            out[f"{rel}::{name}"] = [s or ({target} if target else set()) for s in sets]
    return out


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


def test_each_target_collects_where_its_tests_are():
    """A target's pytest run names the paths it collects (the whole tree cost
    each worker ~6 s): every test carrying its marker lies under one of them,
    and each is inside the marker's folder or an ELSEWHERE file."""
    marks = _every_test_and_its_markers()
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    for marker, folder in conftest.TARGET_FOLDERS.items():
        lines = re.findall(rf"-m {marker}\b(.*)$", makefile, re.M)
        assert len(lines) == 1, (marker, lines)
        paths = [w for w in lines[0].split() if w.startswith("tests")]
        assert paths, (marker, lines[0])
        for path in paths:
            assert path == f"tests/{folder}" or path.startswith(f"tests/{folder}/") or \
                any(e.startswith(path + "::") for e in ELSEWHERE), (marker, path)
        carrying = [n for n, sets in marks.items() if marker in set().union(*sets)]
        assert carrying, marker
        outside = [n for n in carrying
                   if not any(n == p or n.startswith(p + "/") or n.startswith(p + "::")
                              for p in paths)]
        assert not outside, (marker, outside[:5])


def test_marked_tests_live_in_their_targets_folder():
    """Read from the sources (seconds; collecting every module in a pytest
    subprocess took 26-54 s)."""
    marks = _every_test_and_its_markers()
    assert len(marks) > 500, len(marks)
    misplaced = []
    for nodeid, sets in marks.items():
        if nodeid.startswith(tuple(e.rstrip("[") for e in ELSEWHERE)):
            continue
        for marker in set().union(*sets):
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
            for targets in marks[n]:
                assert len(targets) == 1 and (marker in targets or folder == "zoo"), (n, targets)
    both = [n for n, sets in marks.items() if any(len(t) > 1 for t in sets)]
    assert not both, both


def test_the_static_reading_agrees_with_pytest_on_a_sample(tmp_path):
    """The reading above against pytest's own markers, on files that use
    each form (module pytestmark, decorators, pytest.param marks, a folder
    target): the same target per test."""
    sample = ["tests/launchers/test_launcher_skip.py", "tests/torchax/test_torchax_accelerator.py",
              "tests/api/test_layout.py"]
    (tmp_path / "dump_marks.py").write_text(DUMP)
    out = tmp_path / "marks.json"
    markers = " or ".join(conftest.TARGET_FOLDERS)
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "dump_marks", "-p", "no:xdist", "-m", f"{markers} or not ({markers})",
                           *sample], capture_output=True, text=True, cwd=ROOT,
                          env=_sample_env(tmp_path, out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = json.loads(out.read_text())
    # every sample file read: a run that collected nothing would pass below
    assert {n.split("::")[0] for n in collected} == set(sample), sorted(collected)
    static = _every_test_and_its_markers()
    for nodeid, names in collected.items():
        test = nodeid.split("[")[0]
        got = set(names) & set(conftest.TARGET_FOLDERS)
        assert got in static[test], (nodeid, got, static[test])


def _sample_env(plugin_dir, out) -> dict:
    """The sample's pytest run: none of this run's pytest variables (a
    PYTEST_ADDOPTS of `-k ...` would deselect the sample, `-p plugin` fail
    it), the dumping plugin's folder ahead of the caller's PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(plugin_dir), os.environ.get("PYTHONPATH")) if p)
    return nested_pytest_env(PYTHONPATH=path, XLA_AMP_MARKS_OUT=str(out))


def test_the_samples_run_leaves_this_runs_pytest_options_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k nothing -p a_plugin_on_the_callers_path")
    monkeypatch.setenv("PYTHONPATH", "/the/callers/plugins")
    env = _sample_env(tmp_path, tmp_path / "marks.json")
    assert not [k for k in env if k.startswith("PYTEST")], env
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/the/callers/plugins"]
    assert env["XLA_AMP_MARKS_OUT"] == str(tmp_path / "marks.json")


DUMP = '''
import json, os
def pytest_collection_finish(session):
    with open(os.environ["XLA_AMP_MARKS_OUT"], "w") as f:
        json.dump({i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}, f)
'''
