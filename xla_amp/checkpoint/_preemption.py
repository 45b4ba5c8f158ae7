"""Turn SIGTERM / SIGINT into "save at the next step boundary, then exit".

A preemptible TPU VM (spot, queued resources) gets SIGTERM about 30 s
before it stops. Saving inside the signal handler would read tensors in
the middle of a traced step (a half-built XLA graph); the handler only
records the signal, and the loop acts where the step ends::

    with xla_amp.checkpoint.preemption_guard() as guard:
        for step, batch in ...:
            train_step(batch)                      # the step in flight finishes
            if guard.requested:                    # a plain bool: no device read
                save(...); sys.exit(EXIT_PREEMPTED)

A second SIGINT (Ctrl-C twice) interrupts at once, as Python's default
does; a second SIGTERM is only recorded (the VM's own deadline ends the
process). Leaving the ``with`` restores the previous handlers.
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Iterable, Optional

# The exit status of a run stopped by a signal after writing its
# checkpoint: sysexits.h's EX_TEMPFAIL ("try again later"). A restart
# script resumes on it; any other non-zero status is a real failure.
EXIT_PREEMPTED = 75
# The exit status of a run that could not write a checkpoint (disk full,
# read-only, no permission, quota): EX_IOERR. The previous one is intact.
EXIT_CHECKPOINT_IO = 74
# The exit status of a run refused because another run holds its
# checkpoint path: EX_CANTCREAT.
EXIT_LOCKED = 73


class PreemptionGuard:
    """Records SIGTERM / SIGINT while active; see the module docstring."""

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)):
        self.signals = tuple(signals)
        self._previous: dict[int, object] = {}
        self.signum: Optional[int] = None
        self.received_at: Optional[float] = None

    @property
    def requested(self) -> bool:
        """True once one of the signals arrived: save and stop at the next
        step boundary."""
        return self.signum is not None

    @property
    def signal_name(self) -> Optional[str]:
        return None if self.signum is None else signal.Signals(self.signum).name

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now
        if self.signum is None:
            self.signum, self.received_at = signum, time.monotonic()

    def __enter__(self) -> "PreemptionGuard":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("preemption_guard: signal handlers can only be installed "
                               "from the main thread")
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()


def preemption_guard(signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)
                     ) -> PreemptionGuard:
    """A :class:`PreemptionGuard` for `signals` (default SIGTERM and SIGINT)."""
    return PreemptionGuard(signals)
