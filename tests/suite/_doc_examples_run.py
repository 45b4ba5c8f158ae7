"""Runs the Python examples of the pages named in argv (paths relative to
the checkout) with sybil: per page, its blocks in order in one namespace
(tests/support/doc_fixtures.py's names first, unless the page makes its own
tensors: torchax or SPMD mode), from a fresh temporary folder. Prints one
JSON line, {page: {"ran": [...], "hidden": [...], "skipped": [[line,
reason]], "failed": [line, error, traceback tail] or null}}: the lines of the
blocks that ran (the reader's, and the page's hidden set-up blocks), those
skipped with their reasons, and the first failure. tests/suite/test_doc_examples.py
runs a process per page: a page's regions may set process-wide state
(torchax renames PyTorch's PrivateUse1 backend, SPMD mode, torch_xla's
matmul precision)."""
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from unittest import SkipTest

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from tests.support import doc_fixtures

ROOT = Path(__file__).resolve().parents[2]


def run(page: Path) -> dict:
    document = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()]).parse(page)
    lines = page.read_text().splitlines()
    examples = list(document.examples())
    sources = [e.parsed for e in examples if isinstance(e.parsed, str)]
    if not any("torchax" in src or "use_spmd()" in src for src in sources):
        doc_fixtures.setup(document.namespace)
    os.chdir(tempfile.mkdtemp(prefix="doc-examples-"))
    out = {"ran": [], "hidden": [], "skipped": [], "failed": None}
    for example in examples:
        code = isinstance(example.parsed, str)  # a code block (a skip directive is a tuple)
        try:
            example.evaluate()
        except SkipTest as e:
            out["skipped"].append([example.line, str(e)])
            continue
        except BaseException as e:  # noqa: BLE001  (reported with the page and line)
            tb = traceback.format_exc().splitlines()
            out["failed"] = [example.line, f"{type(e).__name__}: {e}"[:500], tb[-6:]]
            break
        if code:  # a fence the reader sees, or an invisible-code-block
            visible = lines[example.line - 1].startswith("```")
            out["ran" if visible else "hidden"].append(example.line)
    return out


if __name__ == "__main__":
    pages = sys.argv[1:]
    texts = [(ROOT / p).read_text() for p in pages]
    if any("use_spmd()" in t for t in texts):
        os.environ.setdefault("CPU_NUM_DEVICES", "2")  # a mesh of two XLA:CPU devices
    print(json.dumps({p: run(ROOT / p) for p in pages}))
