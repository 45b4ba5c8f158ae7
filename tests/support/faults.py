"""Real-process fault injection for the checkpoint tests (not tests
themselves): a launcher process whose output is read as it runs, an
inotify watch on a directory (Linux), and a private mount namespace with
a small or read-only tmpfs where the machine allows one."""
import ctypes
import os
import select
import shutil
import struct
import subprocess
import threading
import time

IN_CREATE, IN_MOVED_TO, IN_CLOSE_WRITE = 0x100, 0x80, 0x8


class Running:
    """A started launcher (tests.support.launch.start) whose stdout and stderr are
    collected by threads, so the test can wait for a line while it runs."""

    def __init__(self, popen: subprocess.Popen):
        self.p = popen
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._pump, args=(s, buf), daemon=True)
                         for s, buf in ((popen.stdout, self.out), (popen.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, buf):
        for line in stream:
            buf.append(line)

    def wait_for(self, text: str, timeout: float = 300) -> bool:
        """True once `text` appears in stdout; False if the process ended first."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in self.out):
                return True
            if self.p.poll() is not None:
                time.sleep(0.2)
                return any(text in line for line in self.out)
            time.sleep(0.05)
        raise TimeoutError(f"no {text!r} in {timeout} s:\n{''.join(self.out)}{''.join(self.err)}")

    def cpu_seconds(self) -> float:
        """The process's CPU time so far, all its threads (user + system)."""
        with open(f"/proc/{self.p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_cpu(self, seconds: float, timeout: float = 300) -> bool:
        """True once the process has used `seconds` more CPU time than when
        called; False if it ended first. A moment on the run's own clock:
        another process on the cores slows its wall clock, not this one, so
        a seeded moment lands at the same point of the run under load."""
        try:
            goal = self.cpu_seconds() + seconds
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if self.p.poll() is not None or self.cpu_seconds() >= goal:
                    return self.p.poll() is None
                time.sleep(0.02)
        except FileNotFoundError:  # (ended between poll and read)
            return False
        raise TimeoutError(f"{seconds} s of CPU time not used in {timeout} s")

    def finish(self, timeout: float = 400):
        rc = self.p.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        return rc, "".join(self.out), "".join(self.err)

    def preempted(self, path) -> int:
        """Wait for a run sent SIGTERM: exit status 75, one "stopped by
        SIGTERM" line naming `path`, no traceback; the steps it had done."""
        rc, out, err = self.finish()
        assert rc == 75, err[-3000:]
        lines = [ln for ln in out.splitlines() if ln.startswith("stopped by SIGTERM")]
        assert len(lines) == 1 and str(path) in lines[0], out
        assert "Traceback" not in err
        return int(lines[0].split("after step ")[1].split(":")[0])


class DirWatch:
    """inotify on one directory: (mask, name) of each file created or
    renamed into it, in order, as they happen."""

    def __init__(self, directory: str, mask: int = IN_CREATE | IN_MOVED_TO):
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if self._libc.inotify_add_watch(self.fd, os.fsencode(directory), mask) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch", directory)
        self._pending: list = []

    def next(self, timeout: float):
        """The next event, or None after `timeout` seconds."""
        if not self._pending:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            data = os.read(self.fd, 65536)
            i = 0
            while i < len(data):
                _, mask, _, n = struct.unpack_from("iIII", data, i)
                name = data[i + 16:i + 16 + n].rstrip(b"\0").decode()
                self._pending.append((mask, name))
                i += 16 + n
        return self._pending.pop(0)

    def close(self):
        os.close(self.fd)


def mount_namespaces_work() -> bool:
    """True where `unshare -m` as root can mount a tmpfs (then disk-full and
    read-only tests use one; otherwise RLIMIT_FSIZE stands in)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d && "
                            "umount $d && rmdir $d"], capture_output=True)
    return probe.returncode == 0


def in_mount_namespace(script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the shell `script` in a private mount namespace (its mounts vanish
    with it; copy what the test reads to a directory outside them)."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script],
                          capture_output=True, text=True, timeout=timeout)
