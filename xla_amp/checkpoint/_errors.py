"""The checkpoint errors: each one line that names the file."""
from __future__ import annotations

import errno


class CheckpointError(Exception):
    """A checkpoint could not be written or read; the message is one line
    naming the path and the reason. Nothing at the path was changed."""


class CheckpointLocked(CheckpointError):
    """Another live process holds the checkpoint path's lock."""


class CheckpointDamaged(CheckpointError):
    """The file's bytes are not what was written: a tensor or the plain data
    does not match the checksum saved with it, or the file is torn or
    garbled so that torch cannot read it. Nothing was loaded from it."""


def os_reason(e: OSError) -> str:
    """``"No space left on device [ENOSPC]"``: the OS's words and the code."""
    code = errno.errorcode.get(e.errno or 0)
    text = e.strerror or str(e)
    return f"{text} [{code}]" if code else text
