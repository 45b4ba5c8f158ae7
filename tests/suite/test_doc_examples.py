"""Every Python block of README.md and docs/*.md runs on XLA:CPU
(tests/suite/_doc_examples_run.py, sybil: a process per page, the blocks in
order in one namespace, tests/support/doc_fixtures.py's names given), or is
marked `<!-- skip: next "reason" -->` with the reason it cannot run here (a
TPU, a GPU, a pod). A block that stops running fails with its page and line."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support import launch

PAGES = ["README.md"] + sorted(f"docs/{n}" for n in os.listdir(os.path.join(launch.ROOT, "docs"))
                               if n.endswith(".md"))
FENCE = re.compile(r"^```python\s*$")


def _fences(page) -> list[int]:
    with open(os.path.join(launch.ROOT, page)) as f:
        return [i for i, line in enumerate(f, 1) if FENCE.match(line)]


WITH_CODE = [p for p in PAGES if _fences(p)]


def test_the_pages_with_python_are_found():
    assert "README.md" in WITH_CODE and "docs/policies.md" in WITH_CODE
    assert sum(len(_fences(p)) for p in WITH_CODE) >= 30


def _check(page, result):
    if result["failed"]:
        line, error, where = result["failed"]
        pytest.fail(f"{page}:{line}: {error}\n" + "\n".join(where), pytrace=False)
    skipped = {line: reason for line, reason in result["skipped"]}
    assert all(reason.strip() for reason in skipped.values()), (page, skipped)
    fences = _fences(page)
    missing = [n for n in fences if n not in result["ran"] and n not in skipped]
    assert not missing, f"{page}: blocks at lines {missing} neither ran nor were skipped"
    assert sorted(result["ran"] + list(skipped)) == fences, (page, result)


@pytest.mark.parametrize("page", WITH_CODE)
def test_every_python_block_runs_or_says_why_not(page):
    """A process per page, as a user runs a script: one page's regions set
    process-wide state (torch_xla's matmul precision, SPMD mode, torchax's
    PrivateUse1 name) that another page's first region would meet."""
    _check(page, _run(page)[page])


def _run(page) -> dict:
    proc = subprocess.run([sys.executable, os.path.join("tests", "suite", "_doc_examples_run.py"),
                           page], capture_output=True, text=True, timeout=600, cwd=launch.ROOT,
                          env=launch.launch_env(JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, f"{page}: the runner failed\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_block_that_stops_running_is_named_by_page_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nw = model[0].weight\n```\n\n"
                    "<!-- skip: next \"needs a TPU\" -->\n```python\nimport no_such_tpu\n```\n\n"
                    "```python\nassert w.shape == (32, 16)\nundefined_name\n```\n")
    result = _run(str(page))[str(page)]
    assert result["ran"] == [3] and result["skipped"] == [[8, "needs a TPU"]]
    line, error, _ = result["failed"]
    assert (line, error) == (12, "NameError: name 'undefined_name' is not defined")
