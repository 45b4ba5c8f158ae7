"""The launchers' checkpoints (--checkpoint, --resume, --auto_resume,
--keep_checkpoints): model, optimizer, scaler, data position and the
training record in one file, through ``xla_amp.checkpoint`` (which writes
a checksum of every tensor into it and verifies them on reading).

    ck = Checkpoints.from_flags(FLAGS)   # the path's lock, or exit 73
    state = ck.resume_state(compat)      # --resume / --auto_resume: data only
    ck.save(run, position)               # atomic; CheckpointError on an OS failure

With --fsdp the checkpoint is a sharded one (``xla_amp.sharded.save``:
a directory of versions, each device writing its own shards; the data
position in its record); a --checkpoint or --resume that is an existing
file (an earlier --fsdp run's, which gathered the shards) is read and
written as a file, as before.

A damaged file is never written over. --resume of one: exit 2, one line.
--auto_resume resumes from the newest intact file of --checkpoint,
--checkpoint.1, ... (--keep_checkpoints): each damaged newer one is first
renamed to PATH.damaged (one line each), so the next save's rotation never
moves it over an intact one; with no intact one it stops with exit 2 and
changes nothing.

Exit statuses (docs/launchers.md): 2 a refused or damaged resume file;
73 another run holds --checkpoint; 74 a checkpoint could not be written
(the previous one is intact); 75 stopped by SIGTERM/SIGINT after writing
the checkpoint (restart with --auto_resume).
"""
from __future__ import annotations

import os
import sys
from typing import Optional

FORMAT = "xla_amp-launcher-checkpoint/2"
OLD_FORMAT = "xla_amp-launcher-checkpoint/1"   # launchers before the training record
# configuration a resume converts (xla_amp.checkpoint.restore) instead of refusing
CONVERTED = ("precision", "amp")
# The exit status of a refused resume: a --resume file that is damaged,
# hostile or of another configuration, or an --auto_resume with no intact
# checkpoint (also absl's status for bad flags).
EXIT_BAD_RESUME = 2


def fail(status: int, message: str):
    """Print one line to stderr and exit with `status`."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


class Checkpoints:
    """The run's checkpoint file: locked from the start of the run to its end."""

    def __init__(self, path: Optional[str], resume: Optional[str], auto_resume: bool,
                 keep: int, allow_rounding: bool, sharded: bool = False):
        self.path = os.path.abspath(path) if path else None
        # --fsdp: a sharded checkpoint, unless one of the earlier files is there
        self.sharded = sharded and not any(p and os.path.isfile(p) for p in (path, resume))
        self.keep = keep
        self.allow_rounding = allow_rounding
        self.resume = resume             # --auto_resume: set by resume_state
        self.auto_resume = bool(auto_resume and self.path)
        self.lock = None

    @classmethod
    def from_flags(cls, flags) -> "Checkpoints":
        ck = cls(flags.checkpoint, flags.resume, flags.auto_resume, flags.keep_checkpoints,
                 flags.resume_allow_rounding, sharded=flags.fsdp)
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
        """The state to resume from (None: start fresh), read as data only,
        verified against its checksums and checked against this run's
        configuration."""
        from xla_amp import checkpoint as c
        damaged: list = []
        if self.sharded:
            state = self._sharded_state()
        elif self.auto_resume:
            state, damaged = self._newest_intact()
        elif self.resume:
            try:
                state = c.load(self.resume, format=(FORMAT, OLD_FORMAT), what="--resume file")
            except c.CheckpointError as e:
                fail(EXIT_BAD_RESUME, str(e))
        else:
            state = None
        if state is None:
            return None
        saved = state.get("compat", {})
        diffs = [f"--{k}={saved.get(k)!r} there, --{k}={v!r} here"
                 for k, v in compat.items() if saved.get(k) != v and k not in CONVERTED]
        if diffs:
            fail(EXIT_BAD_RESUME, f"--resume file {self.resume} was written by a different "
                                  "configuration: " + "; ".join(diffs))
        self._set_aside(damaged)
        return state

    def _sharded_state(self) -> Optional[dict]:
        """The position and configuration kept with the sharded checkpoint to
        resume from (its tensors are loaded by ``restore``); None: none."""
        from xla_amp import checkpoint as c
        from xla_amp import sharded
        if self.auto_resume:
            if not sharded.versions(self.path):
                return None
            self.resume = self.path
        elif not self.resume:
            return None
        try:
            extra = sharded.read_extra(self.resume)
        except (c.CheckpointError, ValueError, OSError) as e:
            fail(EXIT_BAD_RESUME, f"--resume directory {self.resume}: {e}")
        if extra.get("format") != FORMAT:
            fail(EXIT_BAD_RESUME, f"--resume directory {self.resume} is not a launcher "
                                  f"checkpoint ({FORMAT})")
        return dict(extra, sharded=self.resume)

    def _newest_intact(self) -> tuple[Optional[dict], list]:
        """--auto_resume: the state of the newest of --checkpoint, .1, .2, ...
        that exists and is intact (None: none exists, start fresh), and the
        damaged newer ones as (path, error). Stops the run (exit 2, nothing
        changed) when every file there is damaged or one is refused."""
        from xla_amp import checkpoint as c
        from xla_amp.checkpoint._files import older
        names = [self.path, *(older(self.path, k) for k in range(1, self.keep))]
        damaged = []
        for name in (n for n in names if os.path.exists(n)):
            try:
                state = c.load(name, format=(FORMAT, OLD_FORMAT), what="--checkpoint file")
            except c.CheckpointDamaged as e:
                damaged.append((name, e))
                continue
            except c.CheckpointError as e:
                fail(EXIT_BAD_RESUME, str(e))
            self.resume = name
            if name != self.path and not damaged:
                print(f"note: --checkpoint file {self.path} is not there; resuming from "
                      f"{name}, the newest one kept", file=sys.stderr, flush=True)
            return state, damaged
        if not damaged:
            return None, []
        also = [n for n, _ in damaged[1:]]
        fail(EXIT_BAD_RESUME,
             f"{damaged[0][1]}"
             + (f" (damaged too: {', '.join(also)})" if also else "")
             + f"; no intact older checkpoint to resume from (--keep_checkpoints {self.keep});"
               " nothing was changed: move the damaged file away to start fresh")

    def _set_aside(self, damaged: list) -> None:
        """Rename each damaged file out of the rotation (one line each)."""
        from xla_amp.checkpoint._files import set_aside
        for name, e in damaged:
            aside = set_aside(name)
            print(f"warning: {e}; moved to {aside}; resuming from {self.resume}, the newest "
                  "intact checkpoint", file=sys.stderr, flush=True)

    def restore(self, state: dict, run_objects: dict) -> list[str]:
        """Load `state` into the run's model, optimizer and scaler, converted
        to this run's precision (``xla_amp.checkpoint.restore``)."""
        from xla_amp import checkpoint as c
        if "sharded" in state:
            return self._restore_sharded(state["sharded"], run_objects)
        if "record" not in state:   # an older launcher's file: read the record off it
            state = dict(state, record=c.infer_record(state, run_objects["model"]))
        try:
            return c.restore(state, allow_rounding=self.allow_rounding, **run_objects)
        except (c.CheckpointError, ValueError) as e:
            fail(EXIT_BAD_RESUME, f"--resume file {self.resume}: "
                 + str(e).replace("allow_rounding=True", "--resume_allow_rounding"))

    def _restore_sharded(self, where: str, run_objects: dict) -> list[str]:
        from xla_amp import checkpoint as c
        from xla_amp import sharded
        try:
            sharded.load(where, model=run_objects["model"], optimizer=run_objects["optimizer"],
                         scaler=run_objects["scaler"], allow_rounding=self.allow_rounding)
        except (c.CheckpointError, ValueError, FileNotFoundError) as e:
            fail(EXIT_BAD_RESUME, f"--resume directory {where}: "
                 + str(e).replace("allow_rounding=True", "--resume_allow_rounding"))
        return []

    def save(self, run, position: dict) -> None:
        """Write the checkpoint (raises xla_amp.checkpoint.CheckpointError on
        an OS failure: the caller ends the run with exit status 74)."""
        from xla_amp import checkpoint as c
        if not self.path:
            return
        if self.sharded:
            from xla_amp import sharded
            sharded.save(self.path, model=run.model, optimizer=run.optimizer, scaler=run.scaler,
                         keep=self.keep, extra={"format": FORMAT, "position": dict(position),
                                                "compat": dict(run.compat)})
            return
        c.save(self.path, model=run.model, optimizer=run.optimizer, scaler=run.scaler,
               amp_dtype=run.amp_dtype, mesh=run.devices.mesh, keep=self.keep, format=FORMAT,
               extra={"position": dict(position), "compat": dict(run.compat)})
