"""The launchers' checkpoints (--checkpoint, --resume, --auto_resume,
--keep_checkpoints): model, optimizer, scaler, data position and the
training record in one file, through ``xla_amp.checkpoint``.

    ck = Checkpoints.from_flags(FLAGS)   # the path's lock, or exit 73
    state = ck.resume_state(compat)      # --resume / --auto_resume: data only
    ck.save(run, position)               # atomic; CheckpointError on an OS failure

Exit statuses (docs/launchers.md): 73 another run holds --checkpoint;
74 a checkpoint could not be written (the previous one is intact);
75 stopped by SIGTERM/SIGINT after writing the checkpoint (restart with
--auto_resume).
"""
from __future__ import annotations

import os
import sys
from typing import Optional

FORMAT = "xla_amp-launcher-checkpoint/2"
OLD_FORMAT = "xla_amp-launcher-checkpoint/1"   # launchers before the training record
# configuration a resume converts (xla_amp.checkpoint.restore) instead of refusing
CONVERTED = ("precision", "amp")


def fail(status: int, message: str):
    """Print one line to stderr and exit with `status`."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


class Checkpoints:
    """The run's checkpoint file: locked from the start of the run to its end."""

    def __init__(self, path: Optional[str], resume: Optional[str], auto_resume: bool,
                 keep: int, allow_rounding: bool):
        self.path = os.path.abspath(path) if path else None
        self.keep = keep
        self.allow_rounding = allow_rounding
        self.resume = resume
        if auto_resume and self.path and os.path.exists(self.path):
            self.resume = self.path
        self.lock = None

    @classmethod
    def from_flags(cls, flags) -> "Checkpoints":
        ck = cls(flags.checkpoint, flags.resume, flags.auto_resume, flags.keep_checkpoints,
                 flags.resume_allow_rounding)
        ck.acquire()
        return ck

    def acquire(self) -> None:
        """Lock --checkpoint (refused in one line if a live run holds it) and
        remove the temporary files of killed writers."""
        from xla_amp import checkpoint as c
        if not self.path:
            return
        try:
            self.lock = c.CheckpointLock(self.path).acquire()
        except c.CheckpointLocked as e:
            fail(c.EXIT_LOCKED, f"--checkpoint: {e}")
        except c.CheckpointError as e:
            fail(c.EXIT_CHECKPOINT_IO, f"--checkpoint: {e}")
        c.remove_stale_temporaries(self.path)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def resume_state(self, compat: dict) -> Optional[dict]:
        """The state to resume from (None: start fresh), read as data only
        and checked against this run's configuration."""
        from xla_amp import checkpoint as c
        if not self.resume:
            return None
        what = "--resume file"
        try:
            state = c.load(self.resume, format=(FORMAT, OLD_FORMAT), what=what)
        except c.CheckpointError as e:
            fail(2, str(e))
        saved = state.get("compat", {})
        diffs = [f"--{k}={saved.get(k)!r} there, --{k}={v!r} here"
                 for k, v in compat.items() if saved.get(k) != v and k not in CONVERTED]
        if diffs:
            fail(2, f"{what} {self.resume} was written by a different configuration: "
                    + "; ".join(diffs))
        return state

    def restore(self, state: dict, run_objects: dict) -> list[str]:
        """Load `state` into the run's model, optimizer and scaler, converted
        to this run's precision (``xla_amp.checkpoint.restore``)."""
        from xla_amp import checkpoint as c
        if "record" not in state:   # an older launcher's file: read the record off it
            state = dict(state, record=c.infer_record(state, run_objects["model"]))
        try:
            return c.restore(state, allow_rounding=self.allow_rounding, **run_objects)
        except (c.CheckpointError, ValueError) as e:
            fail(2, f"--resume file {self.resume}: "
                    + str(e).replace("allow_rounding=True", "--resume_allow_rounding"))

    def save(self, run, position: dict) -> None:
        """Write the checkpoint (raises xla_amp.checkpoint.CheckpointError on
        an OS failure: the caller ends the run with exit status 74)."""
        from xla_amp import checkpoint as c
        if not self.path:
            return
        c.save(self.path, model=run.model, optimizer=run.optimizer, scaler=run.scaler,
               amp_dtype=run.amp_dtype, mesh=run.devices.mesh, keep=self.keep, format=FORMAT,
               extra={"position": dict(position), "compat": dict(run.compat)})
