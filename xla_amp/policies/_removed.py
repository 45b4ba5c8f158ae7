"""Ops a newer torch removed: a policy file's ``[removed_in]`` table, and the
file helpers the loaders share (reading, ``file:line`` of an entry).

A policy file records the torch release that removed an op it lists::

    [removed_in]         # op -> the first torch release without it, cited
    "aten::cholesky" = { torch = "2.14", source = "ops: ... up to 2.13.0, not in 2.14.0" }

(a bare ``"aten::cholesky" = "2.14"`` is read too). Loading the file on a
torch that lacks a listed op:

* the op is in ``[removed_in]`` with a release <= the running torch: it is
  left out of the policy, which records it (``Policy.skipped_ops``, op ->
  release);
* it is there with a later release: refused, naming the ``[removed_in]``
  line (the record is wrong: this torch should still have the op);
* it is not there: refused as an unknown op, with near names, as ever.

An op the running torch has is used normally, whatever the table says.
Releases compare as (major, minor, patch); a pre-release or local build
(``2.14.0a0+git...``, ``2.15.0+cu132``) counts as its release.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch

SECTION = "removed_in"
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_SECTION_LINE = re.compile(r"\s*\[([^\[\]]+)\]")


def release(version: str) -> tuple[int, int, int]:
    """``"2.14"`` -> (2, 14, 0); ``"2.15.0+cu132"`` -> (2, 15, 0)."""
    m = _RELEASE.match(version)
    if m is None:
        raise ValueError(f"{version!r} is not a torch release such as \"2.14\"")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def running() -> tuple[int, int, int]:
    """The running torch's release."""
    return release(torch.__version__)


def line_of(text: str, key: str, section: str | None = None) -> int:
    """The line of ``"key"`` (or of a bare ``key =``) in `text` (within
    ``[section]`` if given); 0 if none."""
    current = None
    bare = re.compile(rf"\s*{re.escape(key)}\s*=")
    for i, line in enumerate(text.splitlines(), 1):
        header = _SECTION_LINE.match(line)
        if header:
            current = header.group(1).strip()
        elif (f'"{key}"' in line or bare.match(line)) and section in (None, current):
            return i
    return 0


def read_toml(path: Path) -> tuple[str, dict]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read policy file: {e.strerror}") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: {e}") from None


def read_table(path: Path, text: str, data: dict) -> dict[str, str]:
    """A policy file's ``[removed_in]``: op -> release. ValueError with
    file:line for an entry that is not a release or names an op no other
    table of the file lists."""
    table = data.get(SECTION, {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [{SECTION}] must be a table of op = torch release")
    listed = {op for section, entries in data.items()
              if isinstance(entries, dict) and section not in ("sources", SECTION)
              for op in entries}
    out = {}
    for op, value in table.items():
        where = f"{path}:{line_of(text, op, SECTION)}"
        version = value.get("torch") if isinstance(value, dict) else value
        if not isinstance(version, str) or not _RELEASE.fullmatch(version):
            raise ValueError(
                f"{where}: [{SECTION}] {op} = {value!r} is not a torch release such as "
                '"2.14" or { torch = "2.14", source = "..." }')
        if op not in listed:
            raise ValueError(f"{where}: [{SECTION}] names {op}, which no table of this file lists")
        out[op] = version
    return out


def skip(path: Path, text: str, op: str, version: str) -> str:
    """`op`, which [removed_in] says torch `version` removed, is missing from
    the running torch: returns `version` when that release is not newer than
    the running one (the op is left out); otherwise the record is wrong and
    the ValueError names its line."""
    if release(version) <= running():
        return version
    raise ValueError(
        f"{path}:{line_of(text, op, SECTION)}: [{SECTION}] says torch {version} removed "
        f"{op}, but the running torch {torch.__version__} is older and lacks it already "
        "(the record is wrong)")
