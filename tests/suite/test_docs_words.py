"""The docs, .ci/run, the Makefile and benchmarks/ say what is true of the
project now, not how it was made: no work periods ("the twenty-sixth
session"), no lent hardware, no machine it was built on ("this VM", "the
same Xeon VM"), no issue numbers of this project used as dates or labels
("#53", "issue #37"), no "an earlier version of this page". Issue numbers of
other projects (pytorch/xla#7299, litgpt#518, "pytorch/xla issue #5005") are
facts about them and stay. Plain file reads and regular expressions: well
under a second."""
import os
import re

from tests.support.launch import ROOT

FILES = ("README.md", "CHANGELOG.md", ".ci/run", "Makefile")
# Every text file under these, docs/upstream/ too, but for these extensions:
# measured data (results, should benchmarks/ ever hold some) and binaries
# (docs/*.png), not prose.
FOLDERS = ("docs", "benchmarks")
DATA_EXTENSIONS = (".json", ".jsonl", ".csv", ".tsv", ".png", ".jpg", ".svg", ".pyc", ".so",
                   ".gz", ".tgz")

_ORDINAL = (r"(?:twenty-|thirty-)?(?:first|second|third|fourth|fifth|sixth|seventh|eighth"
            r"|ninth)|tenth|eleventh|twelfth|(?:thir|four|fif|six|seven|eigh|nine)teenth"
            r"|twentieth|thirtieth")
_HOST = r"(?:\d+-core\s+|intel\s+|amd\s+|xeon\s+|epyc\s+|new\s+)*"
# The first pattern that matches at a place names the hit.
WORDS = [
    re.compile(rf"\b(?:{_ORDINAL})\s+sessions?\b", re.I),     # "the twenty-sixth session"
    re.compile(r"\bsessions?\b", re.I),                       # "session 6", "this session"
    re.compile(r"\b(?:lend|lends|lent|lending)\b", re.I),     # "on a lent GPU"
    re.compile(rf"\bthis\s+{_HOST}(?:vm|host|machine)s?\b", re.I),  # "this 2-core host"
    re.compile(r"\b(?:same|new|previous|last)\s+(?:(?:xeon|epyc|intel|amd)\s+)?vms?\b",
               re.I),                                     # "on the same Xeon VM"
    re.compile(r"\ban earlier version of this page\b", re.I),
    re.compile(r"\bissues?\s+#\d+|(?<![\w/#&])#\d\d(?!\w)", re.I),  # "issue #37", "(#53)"
]
# A literal part of each pattern, lower case: a line without one is not read
# further (most lines; the patterns themselves cost ~0.4 s over every line).
_CANDIDATE = re.compile(r"session|len[dt]|this\b|vm|earlier|issue|#\d\d")
# A repository's name just before the number makes it that project's issue:
# pytorch/xla#7299 (the lookbehind above), "pytorch/xla issue #5005".
UPSTREAM = re.compile(r"\b[\w.-]+/[\w.-]+\s+$")

# Whole lines (stripped) where a word means something else; each excuses
# only the word it names.
ALLOWED = [
    # A pytest fixture's scope: "session" is one pytest run.
    ("session", re.compile(r"""@pytest\.fixture\(.*\bscope=["']session["'].*""")),
    # A pytest hook's Session argument (pytest_sessionstart(session), ...).
    ("session", re.compile(r"def pytest_\w+\(.*\bsession\b.*")),
    # An HTTP client's session (requests.Session: pooled connections).
    ("session", re.compile(r".*\brequests\.Session\(.*")),
]


def _paths():
    for name in FILES:
        if os.path.isfile(os.path.join(ROOT, name)):
            yield name
    for top in FOLDERS:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if not f.endswith(DATA_EXTENSIONS):
                    yield os.path.relpath(os.path.join(folder, f), ROOT)


def hits_in(text: str) -> list[tuple[int, str]]:
    """(line number, word) of each work-log word in `text`."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not _CANDIDATE.search(line.lower()):
            continue
        # with the next line: a phrase may go on there ("this\nVM", "issues\n#50")
        both = line + " " + (lines[i + 1] if i + 1 < len(lines) else "")
        taken, found = [], []
        for pattern in WORDS:
            for m in pattern.finditer(both):
                if m.start() >= len(line) or any(a < m.end() and m.start() < b
                                                 for a, b in taken):
                    continue
                taken.append(m.span())
                before = (lines[i - 1] + " " if i else "") + both[:m.start()]
                if m.group().lower().startswith("issue") and UPSTREAM.search(before):
                    continue
                word = m.group().split()[-1].lower().rstrip("s")
                if any(w == word and p.fullmatch(line.strip()) for w, p in ALLOWED):
                    continue
                found.append((m.start(), " ".join(m.group().split())))
        out += [(i + 1, word) for _, word in sorted(found)]
    return out


def test_no_work_log_words():
    hits = []
    for rel in _paths():
        try:
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue  # not text
        lines = text.splitlines()
        hits += [f"{rel}:{n}: {word!r} {lines[n - 1].strip()[:70]}" for n, word in hits_in(text)]
    assert not hits, f"{len(hits)} work-log words:\n" + "\n".join(hits)


def test_the_words_and_the_exceptions():
    """Each pattern catches its phrase; upstream numbers and the allowed
    lines pass."""
    caught = ["the twenty-sixth session", "in session 6", "on a lent GPU", "No TPU can be lent",
              "this VM booted", "This machine's pip cap", "on this 2-core host", "(#53)",
              "issue #37", "Issues #50 and #51", "An earlier version of this page said",
              "on this\nVM", "issues\n#50", "An earlier\nversion of this page",
              "on the same Xeon VM", "a new VM"]
    for text in caught:
        assert hits_in(text), text
    passed = ["pytorch/xla#7299", "litgpt#518, pytorch/xla#7177", "pytorch/ao 1297",
              "pytorch/xla issue 5005", "pytorch/xla issue #5005", "color #9e9e9e",
              "a TPU VM", "a 2-core Intel Xeon VM", "the host's driver", "silent", "## 1. Steps",
              '@pytest.fixture(scope="session")', "def pytest_sessionfinish(session, exitstatus):"]
    for text in passed:
        assert not hits_in(text), text
    assert hits_in("#53, the twentieth session") == [(1, "#53"), (1, "twentieth session")]
    assert hits_in("the twentieth\nsession") == [(2, "session")]  # caught, by the bare word
    assert hits_in("pytorch/xla\nissue #5005; and #53") == [(2, "#53")]
