"""Checkpoints that survive the machine: preemption, full disks, two runs on
one path, files from strangers, a resume in another precision mode.

    from xla_amp import checkpoint as ckpt
    with ckpt.CheckpointLock(path), ckpt.preemption_guard() as guard:
        state = ckpt.load(path) if os.path.exists(path) else None    # data only
        if state: ckpt.restore(state, model=model, optimizer=opt, scaler=scaler,
                               amp_dtype=torch.bfloat16)             # converts or refuses
        for step ...:
            train_step()
            if step % 100 == 0 or guard.requested:
                ckpt.save(path, model=model, optimizer=opt, scaler=scaler,
                          amp_dtype=torch.bfloat16, extra={"step": step}, keep=2)
            if guard.requested:
                sys.exit(ckpt.EXIT_PREEMPTED)

Writing: a unique temporary file, fsync, rename, fsync of the directory
(``_files``); any OS failure is one :class:`CheckpointError` line naming
the path. Reading: ``weights_only=True`` (``_read``). Integrity: a
checksum of every tensor and of the rest goes into each file ``save``
writes and is verified on reading (``_integrity``). Locking: ``flock`` on
``PATH.lock``, released by the kernel when its holder dies (``_lock``).
Precision: a record of how the run trained travels in the file
(``_record``) and a resume converts exactly or refuses (``_convert``).
docs/checkpoints.md has the whole story.
"""
from xla_amp.checkpoint._convert import convert
from xla_amp.checkpoint._errors import CheckpointDamaged, CheckpointError, CheckpointLocked
from xla_amp.checkpoint._files import remove_stale_temporaries, write_atomic
from xla_amp.checkpoint._lock import CheckpointLock
from xla_amp.checkpoint._preemption import (EXIT_CHECKPOINT_IO, EXIT_LOCKED, EXIT_PREEMPTED,
                                            PreemptionGuard, preemption_guard)
from xla_amp.checkpoint._read import read
from xla_amp.checkpoint._record import infer_record, mode_name, training_record
from xla_amp.checkpoint._state import load, restore, save, snapshot

__all__ = ["CheckpointError", "CheckpointLocked", "CheckpointDamaged", "CheckpointLock",
           "PreemptionGuard", "preemption_guard", "EXIT_PREEMPTED", "EXIT_CHECKPOINT_IO",
           "EXIT_LOCKED", "save", "load", "restore", "snapshot", "read", "write_atomic",
           "remove_stale_temporaries", "training_record", "infer_record", "mode_name",
           "convert"]
