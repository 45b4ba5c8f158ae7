"""`initialize_distributed`: ``jax.distributed.initialize`` for a torchax run
on several processes, set up so that a process that dies makes the others
exit non-zero within seconds, naming it, instead of blocking in a
collective.

When to call: once in every process, first thing -- before any JAX
computation, before ``make_train_step`` -- where you would call
``jax.distributed.initialize``, with the coordinator's address, the number of
processes and this process's id given explicitly (no cluster auto-detection
here). End every process with ``jax.distributed.shutdown()``::

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only
    xla_amp.torchax.initialize_distributed("10.0.0.1:1234", 2, rank)
    step = xla_amp.torchax.make_train_step(model, loss_fn, opt, mesh=mesh)
    for x, y in batches:
        step(x, y)
    jax.distributed.shutdown()

What JAX does alone (jax 0.10, two processes x 2 CPU devices, gloo):

    process 0 (the coordinator: JAX's coordination service runs in it)
    dies: the others are aborted at once (0.2 s measured): their client's
    error-polling RPC to the service sees the socket close and a C++
    LOG(FATAL) ("... Either the leader task was preempted/died ...") raises
    SIGABRT. A coordinator host that vanishes without closing its sockets
    would be noticed by the clients' heartbeats instead (not tested).
    any other process dies: the survivors block in the step's collective
    (gloo does not notice) until the service marks the dead process after
    no heartbeat for heartbeat_timeout_seconds -- processes beat every half
    of it, so 1/2 to 1 timeout after the death -- and aborts every other
    process (SIGABRT, a multi-line C++ log listing the lost task ids):
    50-100 s with JAX's default of 100 s (77-90 s measured), 11-16 s
    measured with 16 s.

What this adds for the second case, the watchdog: one daemon thread per
process. Every ``min(1 s, peer_timeout_s / 4)`` it writes a counter under
its own key (``xla_amp/torchax/alive/<process id>``) in the coordination
service's key-value store and reads every process's key (one
``key_value_dir_get``). It ends this process with
``os._exit(PEER_LOST_EXIT_CODE)`` and one line on stderr -- ``os._exit``,
because the main thread may be blocked in a collective that never
returns -- when

    a process's counter has not changed for peer_timeout_s:
        xla_amp.torchax: process 1 of 2 stopped answering (no heartbeat for
        6.0 s); exiting (process 0, status 75)
    a process ended on an unhandled exception (its atexit hook marks its
    key "fail" once every other watched process has beaten since -- an
    exception raised because a peer died, such as gloo's "Connection reset
    by peer" in the step, ends it with the peer named as above instead; a
    clean end marks it "exit", no longer watched):
        xla_amp.torchax: process 1 of 2 failed (an unhandled exception
        there); exiting (process 0, status 75)

The values and why (the goal: a killed process reported, named, within
20 s; 5-7 s measured, see docs/torchax.md):

    peer_timeout_s=6            six missed beats. A process whose Python
                                cannot run that long looks dead; torch.save
                                / torch.load, XLA's executions and
                                jax.distributed.shutdown's wait release the
                                GIL (gaps under 0.1 s measured). Raise it
                                for a C extension that holds the GIL longer.
    heartbeat_timeout_s=20      JAX's own detection then falls 10-20 s after
                                a death, after the watchdog's (5-7 s): the
                                watchdog names the process first, and JAX's
                                abort stays the backstop where the watchdog
                                cannot run (the GIL held, an RPC that
                                hangs). Refused below 2 * (peer_timeout_s +
                                2): JAX's earliest abort would come first.
    shutdown_timeout_s=120      how long jax.distributed.shutdown() waits for
                                every process to reach it (JAX: 300): room
                                for process 0 writing the last checkpoint
                                while the others wait; a death during the
                                wait is still reported in seconds.
    initialization_timeout_s=120  how long this call waits for every process
                                to connect (JAX: 300): processes of one job
                                start within a minute of each other.

Processes started with a plain ``jax.distributed.initialize`` never write
their key and are not watched (JAX's abort covers them). The watchdog stops
when ``jax.distributed.shutdown()`` has run. See docs/torchax.md, "Multi-
process failure".
"""
from __future__ import annotations

import atexit
import inspect
import math
import numbers
import os
import sys
import threading
import time

PEER_LOST_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): restart from the last checkpoint
KEY_PREFIX = "xla_amp/torchax/alive/"
EXITED, FAILED = "exit", "fail"  # the last value of a process's key at its end
# jax.distributed.initialize's timeouts, set here from these arguments
_OWN = {"initialization_timeout": "initialization_timeout_s",
        "heartbeat_timeout_seconds": "heartbeat_timeout_s",
        "shutdown_timeout_seconds": "shutdown_timeout_s"}


def initialize_distributed(coordinator_address: str, num_processes: int, process_id: int, *,
                           heartbeat_timeout_s: int = 20, shutdown_timeout_s: int = 120,
                           initialization_timeout_s: int = 120, peer_timeout_s: float = 6.0,
                           **kwargs) -> None:
    """``jax.distributed.initialize(coordinator_address, num_processes,
    process_id, ...)`` with JAX's heartbeat, shutdown and initialization
    timeouts set (whole seconds), then the watchdog (module docstring) when
    there is more than one process. Call once per process, before any JAX
    computation. ``kwargs`` go to ``jax.distributed.initialize`` as they are
    (``local_device_ids``, ``coordinator_bind_address``, ...).

    Every argument is checked before anything changes: a one-line
    ValueError names the one at fault (an address that is not host:port, a
    process id outside [0, num_processes), a timeout that is not a positive
    finite number, heartbeat_timeout_s below 2 * (peer_timeout_s + 2), an
    argument jax.distributed.initialize does not take, or one this helper
    sets under its own name)."""
    import jax

    _check_address(coordinator_address)
    count = _whole("num_processes", num_processes, minimum=1)
    if isinstance(process_id, bool) or not isinstance(process_id, numbers.Integral) \
            or not 0 <= process_id < count:
        raise ValueError(f"initialize_distributed: process_id must be an int in [0, {count}), "
                         f"got {process_id!r}")
    init_s = _whole("initialization_timeout_s", initialization_timeout_s)
    heartbeat_s = _whole("heartbeat_timeout_s", heartbeat_timeout_s)
    shutdown_s = _whole("shutdown_timeout_s", shutdown_timeout_s)
    peer_s = _seconds("peer_timeout_s", peer_timeout_s)
    if heartbeat_s < 2 * (peer_s + 2):
        raise ValueError(f"initialize_distributed: heartbeat_timeout_s={heartbeat_s} must be at "
                         f"least 2 * (peer_timeout_s + 2) = {2 * (peer_s + 2):g} (JAX's abort "
                         f"would come before the watchdog names the lost process)")
    accepted = inspect.signature(jax.distributed.initialize).parameters
    for name in kwargs:
        if name in _OWN:
            raise ValueError(f"initialize_distributed: pass {_OWN[name]}, not {name}")
        if name not in accepted:
            raise ValueError(f"initialize_distributed: jax.distributed.initialize takes no "
                             f"argument {name!r}")

    jax.distributed.initialize(coordinator_address, count, int(process_id),
                               initialization_timeout=init_s,
                               heartbeat_timeout_seconds=heartbeat_s,
                               shutdown_timeout_seconds=shutdown_s, **kwargs)
    if count > 1:
        from jax._src import distributed
        watchdog = _Watchdog(distributed.global_state, int(process_id), count, peer_s)
        watchdog.start()
        atexit.register(watchdog.stop_at_exit)


def _check_address(address):
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"initialize_distributed: coordinator_address must be 'host:port', "
                         f"got {address!r}")


def _seconds(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"initialize_distributed: {name} must be a positive finite number of "
                         f"seconds, got {value!r}")
    return float(value)


def _whole(name, value, minimum=None):
    """A positive whole number (JAX takes int seconds); `minimum` for counts."""
    if minimum is not None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ValueError(f"initialize_distributed: {name} must be an int >= {minimum}, "
                             f"got {value!r}")
        return int(value)
    seconds = _seconds(name, value)
    if not seconds.is_integer():
        raise ValueError(f"initialize_distributed: {name} must be whole seconds, got {value!r}")
    return int(seconds)


class _Watchdog(threading.Thread):
    """The daemon thread of the module docstring: beats, reads every
    process's key, ends this process when one is lost. Stops when
    jax.distributed.shutdown() has replaced the client it started with, or
    at exit (stop_at_exit)."""

    def __init__(self, state, process_id, num_processes, peer_timeout_s):
        super().__init__(name="xla_amp.torchax watchdog", daemon=True)
        self.state, self.client = state, state.client
        self.process_id, self.num_processes = process_id, num_processes
        self.peer_timeout_s = peer_timeout_s
        self.beat_s = min(1.0, peer_timeout_s / 4)
        self.key = f"{KEY_PREFIX}{process_id}"
        self.stopping = threading.Event()
        self.final = EXITED  # what stop_at_exit has the thread write last
        self.raised_at = None  # when stop_at_exit found an unhandled exception
        self.since_raise = None  # every process's value in the first read after it
        self.peers_beat = threading.Event()  # every one has changed since

    def run(self):
        counter, changed = 0, {}
        while not self.stopping.is_set() and self.state.client is self.client:
            counter += 1
            asked = time.monotonic()  # the values read below are at least this recent
            try:
                self.client.key_value_set(self.key, str(counter), allow_overwrite=True)
                entries = self.client.key_value_dir_get(KEY_PREFIX)
            except Exception:  # noqa: BLE001  no answer: the service is gone (JAX
                pass           # aborts this process itself) or a shutdown is under way
            else:
                self._check(entries, changed, asked)
            self.stopping.wait(self.beat_s)
        if self.stopping.is_set() and self.state.client is self.client:
            try:
                self.client.key_value_set(self.key, self.final, allow_overwrite=True)
            except Exception:  # noqa: BLE001  (the service is gone: nothing to tell)
                pass

    def _check(self, entries, changed, now):
        """Records each process's value (when it last changed) and ends this
        process if one failed or has been silent for peer_timeout_s; after
        an unhandled exception here, sets peers_beat once every watched
        value differs from the first read begun after it."""
        failed, silent = [], {}
        for key, value in entries:
            pid = key[len(KEY_PREFIX):]
            if not pid.isdigit() or int(pid) == self.process_id:
                continue
            pid = int(pid)
            if value == FAILED:
                failed.append(pid)
            elif value == EXITED:
                changed.pop(pid, None)
            elif changed.get(pid, (None,))[0] != value:
                changed[pid] = (value, now)
            elif now - changed[pid][1] > self.peer_timeout_s:
                silent[pid] = now - changed[pid][1]
        if self.raised_at is not None and now > self.raised_at:
            values = {pid: value for pid, (value, _) in changed.items()}
            if self.since_raise is None:
                self.since_raise = values
            elif all(values.get(pid) != value for pid, value in self.since_raise.items()):
                self.peers_beat.set()  # (a process that ended since counts as changed)
        if failed and self._watching():
            self._exit(f"{_processes(failed)} of {self.num_processes} failed (an unhandled "
                       f"exception there)")
        if silent and self._watching():
            self._exit(f"{_processes(sorted(silent))} of {self.num_processes} stopped answering "
                       f"(no heartbeat for {min(silent.values()):.1f} s)")

    def _watching(self):
        return not self.stopping.is_set() and self.state.client is self.client

    def _exit(self, what):
        """One line on stderr, best-effort flushes (bounded: another thread
        may hold a stream's lock), then os._exit."""
        line = (f"xla_amp.torchax: {what}; exiting (process {self.process_id}, status "
                f"{PEER_LOST_EXIT_CODE})\n")
        try:
            os.write(2, line.encode())
        except OSError:
            pass
        flusher = threading.Thread(target=_flush, daemon=True)
        try:
            flusher.start()
        except RuntimeError:  # during the exit hook (Python 3.12+: no new threads at
            _flush()          # interpreter shutdown); the main thread waits in it
        else:
            flusher.join(1.0)
        os._exit(PEER_LOST_EXIT_CODE)

    def stop_at_exit(self):
        """atexit: mark this process's key "exit", or "fail" after an
        unhandled exception (sys.last_value / sys.last_exc), so the others
        stop watching it or end at once; bounded wait for the thread.

        Whose failure an exception is, is settled first: a step whose peer
        died raises here too (gloo's "Connection reset by peer"), and
        marking this process "fail" then would name the wrong one to the
        others and leave this one to JAX's shutdown barrier, which aborts
        it a heartbeat timeout later naming nobody. So the watchdog runs on
        until every watched process has beaten after the exception (the
        failure is this process's own: 1-2 beats) or it names a lost one
        and exits; at most peer_timeout_s and three beats."""
        if any(getattr(sys, name, None) is not None for name in ("last_exc", "last_value")):
            if self.is_alive() and self._watching():
                self.raised_at = time.monotonic()
                self.peers_beat.wait(self.peer_timeout_s + 3 * self.beat_s + 1.0)
            self.final = FAILED
        self.stopping.set()
        self.join(2 * self.beat_s + 1.0)


def _processes(pids):
    return (f"process {pids[0]}" if len(pids) == 1
            else "processes " + ", ".join(str(p) for p in pids))


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  (closed or replaced streams)
            pass
