"""What README.md and docs/*.md name exists: every repository path and every
`make TARGET` in backticks (code spans, and the commands of the sh/bash
blocks), every dotted name under xla_amp, xla_amp_launch or benchmarks, and
every relative link, with the heading its #anchor names. Python blocks and
HTML comments are not read (tests/suite/test_doc_examples.py runs the
blocks). What a build writes (BUILT) may be named before it exists; a token
shaped like a path that names something else is listed in NOT_PATHS.
Resolved against the file tree, nothing imported (no torch): well under a
second. A problem is one line: page, line, the name, why."""
import functools
import glob
import os
import re

from tests.support.launch import ROOT

PAGES = ["README.md"] + sorted(
    f"docs/{f}" for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
# A token naming a repository path starts with one of these.
TOP_FOLDERS = ("xla_amp/", "xla_amp_launch/", "tests/", "benchmarks/", "scripts/", "docs/",
               "csrc/", "bazel/", ".ci/")
TOP_FILES = re.compile(r"(?:Makefile|setup\.py|pyproject\.toml|requirements[\w.-]*\.txt"
                       r"|README\.md|CHANGELOG\.md|WORKSPACE|BUILD)(?=$|[/:])")
PACKAGES = ("xla_amp", "xla_amp_launch", "benchmarks")
DOTTED = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")
# "benchmarks.md" is a file, not a module of benchmarks/
FILE_SUFFIX = re.compile(r"\.(?:md|py|txt|toml|json|sh|png|so|log|cpp|h|hlo|gz)$")
SHELL_FENCES = ("sh", "bash", "shell", "console")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\]\n]|\n(?![ \t]*\n))*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\)")
# What a build writes (the Makefile's `build` and `current`; .gitignore'd):
# named before it exists.
BUILT = re.compile(r"xla_amp/(?:\.built(?:-current)?|_build_info[\w*]*\.py|_C[\w.*-]*\.so)$")
BUILT_MODULES = re.compile(r"xla_amp\.(?:_C|_build_info\w*)(?:\.|$)")
# Tokens shaped like a repository path that name something else, and what.
NOT_PATHS = {
    "xla_amp/torchax/alive/<id>": "a key of JAX's coordination service (torchax/_distributed.py)",
}
# A placeholder in a path or a make line: DIR, NAME.py, <model>, ..., …
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:\.\w+)?|.*[<>…].*|.*\.\.\..*)$")


def _blank(text: str, start: int, end: int) -> str:
    """`text` with [start, end) spaced out, its newlines kept (line numbers hold)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def read_page(text: str) -> tuple[str, list[tuple[int, str]]]:
    """The prose of a page (fenced blocks and HTML comments spaced out) and the
    (line number, line) of each line inside a shell fence."""
    for m in reversed(list(re.finditer(r"<!--.*?-->", text, re.S))):
        text = _blank(text, m.start(), m.end())
    lines, shell, fence = text.split("\n"), [], None
    for i, line in enumerate(lines):
        m = re.match(r"\s*(`{3,}|~{3,})\s*([\w-]*)", line)
        if fence is None and m:
            fence = (m.group(1)[0] * len(m.group(1)), m.group(2).lower())
            lines[i] = " " * len(line)
        elif fence is not None:
            if line.strip().startswith(fence[0]) and not line.strip().strip(fence[0][0]):
                fence = None
            elif fence[1] in SHELL_FENCES:
                shell.append((i + 1, line))
            lines[i] = " " * len(line)
    return "\n".join(lines), shell


def code_spans(prose: str) -> list[tuple[int, str]]:
    """(line number, content) of each code span; a span may run over a line break."""
    return [(prose.count("\n", 0, m.start()) + 1, " ".join(m.group(2).split()))
            for m in CODE_SPAN.finditer(prose)]


def _tokens(code: str) -> list[str]:
    out = []
    for word in code.split():
        word = word.strip("\"'(),;[]")
        word = re.sub(r"^[\w-]+=", "", word)            # VAR=value, --flag=value
        word = re.sub(r"[.,;:)'\"]+$", "", word)
        if word:
            out.append(word)
    return out


def _exists(rel: str) -> bool:
    return os.path.exists(os.path.join(ROOT, rel))


def _named_in(name: str, rel: str) -> bool:
    path = os.path.join(ROOT, rel)
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        return re.search(rf"\b{re.escape(name)}\b", f.read()) is not None


def path_problem(token: str) -> str | None:
    """Why a token naming a repository path names nothing there (None: it exists
    or names no path)."""
    if not (token.startswith(TOP_FOLDERS) or TOP_FILES.match(token)) or token in NOT_PATHS:
        return None
    rel = token.split("::")[0]                          # a pytest node id
    rel = re.sub(r"(?::\d+(?:-\d+)?|#L\d+(?:-L?\d+)?)$", "", rel)  # a line
    rel, _, anchor = rel.partition("#")
    if anchor and rel.endswith(".md") and _exists(rel):
        return None if anchor in anchors(rel) else f"no heading #{anchor} in {rel}"
    if _exists(rel) or BUILT.match(rel):
        return None
    braces = re.match(r"(.*?)\{([^{}]*)\}(.*)$", rel)
    candidates = [braces[1] + b + braces[3] for b in braces[2].split(",")] if braces else [rel]
    if all(glob.glob(os.path.join(ROOT, c)) for c in candidates if re.search(r"[*?\[]", c)) \
            and all(_exists(c) for c in candidates if not re.search(r"[*?\[]", c)):
        return None
    parts = rel.rstrip("/").split("/")
    for i, part in enumerate(parts):
        if PLACEHOLDER.match(part) and i > 0:
            prefix = "/".join(parts[:i])
            return None if _exists(prefix) else f"no {prefix}/ in the repository"
    # tests/support/fp8.dots: an attribute of a module named by its path
    head, dot, attr = rel.rpartition(".")
    if dot and "/" not in attr and _named_in(attr, head + ".py"):
        return None
    return "no such file or folder"


@functools.cache
def make_targets() -> frozenset[str]:
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        text = f.read()
    targets = set()
    for line in text.splitlines():
        m = re.match(r"([^\s#:=][^:=]*?)\s*:(?!=)", line)
        if m and not line.startswith("\t"):
            targets.update(m.group(1).split())
    return frozenset(targets)


def make_problems(code: str) -> list[str]:
    """The words after `make` in a command that name no target of the Makefile."""
    out = []
    for m in re.finditer(r"(?:^|[\s;&|(])make((?:\s+[^\s;&|()]+)*)", code):
        words = m.group(1).split()
        skip = False
        for word in words:
            if skip or word.startswith("-") or "=" in word:
                skip = word in ("-C", "-f", "-j")
                continue
            if word.startswith("#"):
                break
            word = word.rstrip(".,:")
            if word and not PLACEHOLDER.match(word) and word not in make_targets():
                out.append(f"make {word}")
    return out


def _module_path(parts: list[str]) -> tuple[str, int]:
    """The deepest file or package of `parts` in the tree, and how many parts it took."""
    rel = parts[0]
    for n, name in enumerate(parts[1:], 1):
        if os.path.isfile(os.path.join(ROOT, rel, name, "__init__.py")):
            rel = f"{rel}/{name}"
        elif os.path.isfile(os.path.join(ROOT, rel, name + ".py")):
            return f"{rel}/{name}.py", n + 1
        elif glob.glob(os.path.join(ROOT, rel, name + ".*so")):
            return f"{rel}/{name}.so", len(parts)       # a native module: not read
        else:
            return f"{rel}/__init__.py", n
    return f"{rel}/__init__.py", len(parts)


def dotted_problem(name: str, depth: int = 0) -> str | None:
    """Why a dotted name under one of PACKAGES resolves to nothing: a module,
    a package, or a name its file holds; a name imported there is followed to
    the module that defines it, where the next part must be named
    (``xla_amp.GradScaler.overflow_report``); parts after that are not read."""
    if BUILT_MODULES.match(name):
        return None                                     # xla_amp._C: built by `make build`
    parts = name.split(".")
    rel, n = _module_path(parts)
    if n == len(parts):
        return None
    attr = parts[n]
    if not _named_in(attr, rel):
        return f"no {attr!r} in {rel}"
    if n + 1 == len(parts):
        return None
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        source = f.read()
    imports = re.finditer(rf"^[ \t]*from\s+(\.+[\w.]*|(?:{'|'.join(PACKAGES)})[\w.]*)\s+"
                          r"import\s+(?:\(([^)]*)\)|([^\n]*))", source, re.M)
    module = next((m.group(1) for m in imports
                   if re.search(rf"\b{re.escape(attr)}\b", m.group(2) or m.group(3))), None)
    if module is None:                                  # defined here
        nxt = parts[n + 1]
        return None if _named_in(nxt, rel) else f"no {nxt!r} in {rel}"
    if module.startswith("."):                          # relative: from the file's package
        base = os.path.dirname(rel)
        for _ in range(len(module) - len(module.lstrip(".")) - 1):
            base = os.path.dirname(base)
        module = base.replace("/", ".") + "." + module.lstrip(".")
    if depth == 4:
        return None
    return dotted_problem(".".join([module.rstrip(".")] + parts[n:]), depth + 1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def anchors(rel: str) -> frozenset[str]:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        prose, _ = read_page(f.read())
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", prose))
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", prose, re.M):
        s = slug(m.group(1))
        out.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return frozenset(out)


def link_problem(page: str, target: str) -> str | None:
    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
        return None                                     # https:, mailto:
    path, _, anchor = target.partition("#")
    rel = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if rel.startswith("..") or not _exists(rel):
        return "no such file or folder"
    if anchor and rel.endswith(".md") and anchor not in anchors(rel):
        return f"no heading #{anchor} in {rel}"
    return None


def page_problems(page: str, text: str) -> list[str]:
    prose, shell = read_page(text)
    found = []                                          # (line, name, why)
    for line, code in code_spans(prose) + shell:
        if (line, code) in shell:
            code = re.sub(r"(?:^|\s)#.*", "", code)     # a comment: not a command
        found += [(line, w, "no such target in the Makefile") for w in make_problems(code)]
        for token in _tokens(code):
            why = path_problem(token)
            if why:
                found.append((line, token, why))
            m = DOTTED.match(token)
            if m and not why and not (FILE_SUFFIX.search(m.group()) and m.end() == len(token)):
                why = dotted_problem(m.group())
                if why:
                    found.append((line, m.group(), why))
    spans = prose
    for m in reversed(list(CODE_SPAN.finditer(prose))):
        spans = _blank(spans, m.start(), m.end())
    for m in LINK.finditer(spans):
        why = link_problem(page, m.group(1))
        if why:
            found.append((spans.count("\n", 0, m.start()) + 1, m.group(1), why))
    return [f"{page}:{line}: {name}: {why}" for line, name, why in sorted(set(found))]


def test_doc_names_exist():
    problems = []
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            problems += page_problems(page, f.read())
    assert not problems, f"{len(problems)} names that lead nowhere:\n" + "\n".join(problems)


def test_the_reader():
    """The parts the check rests on: spans over a line break, fences and
    comments left out, node ids and lines stripped, anchors as GitHub makes
    them."""
    text = ("a `tests/conftest.py::x` and `benchmarks/\nhost_state.py:3`\n"
            "<!-- `tests/nowhere.py` -->\n```python\n`tests/nowhere.py`\n```\n"
            "```sh\nmake test nowhere  # make nothere\n```\n[x](docs/ci.md) `benchmarks.md`")
    prose, shell = read_page(text)
    assert code_spans(prose) == [(1, "tests/conftest.py::x"), (1, "benchmarks/ host_state.py:3"),
                                 (10, "benchmarks.md")]
    assert shell == [(8, "make test nowhere  # make nothere")]
    assert page_problems("README.md", text) == [
        "README.md:8: make nowhere: no such target in the Makefile"]
    assert page_problems("README.md", "`docs/nowhere.md` [y](docs/ci.md#no-such)") == [
        "README.md:1: docs/ci.md#no-such: no heading #no-such in docs/ci.md",
        "README.md:1: docs/nowhere.md: no such file or folder"]
    assert slug("torch_xla through JAX's PJRT plugin (never run on a GPU)") == \
        "torch_xla-through-jaxs-pjrt-plugin-never-run-on-a-gpu"
    assert slug("xla_amp — `autocast` × [fp8](fp8.md)") == "xla_amp--autocast--fp8"
    assert path_problem("xla_amp/_C*.so") is None                 # built by `make build`
    assert path_problem("benchmarks/NAME.py") is None
    assert path_problem("docs/ci.md#no-such") == "no heading #no-such in docs/ci.md"
    assert path_problem("tests/suite/test_doc_paths.py::test_the_reader") is None
    assert path_problem("tests/support/fp8.dots") is None
    assert dotted_problem("xla_amp.fp8.convert") is None
    assert dotted_problem("xla_amp.fp8.nowhere") == "no 'nowhere' in xla_amp/fp8/__init__.py"
    assert dotted_problem("xla_amp.GradScaler.nowhere") == \
        "no 'nowhere' in xla_amp/scaler/_grad_scaler.py"             # followed to its module
    assert make_problems("PIP_NO_CACHE_DIR=1 make venvs && make -C x build dev") == []
