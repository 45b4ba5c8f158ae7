"""A script's ``main(argv)`` served by one long-lived process per pytest
worker: the tests that would each start the script (importing torch,
torch_xla, xla_amp, transformers: 6-9 s a start on 2 cores) send it argv
lists instead, and the process keeps its imports, its Dynamo machinery and
its warmed caches between them. What each call prints is what the script
would have printed as a process of its own.

    zoo = served("tests.support.zoo_check", env)    # its main()
    out = zoo.call(["--check", "--models", "resnet18"], timeout=600)

A call that raises, or a process that dies or runs past `timeout`, raises
ServedError with the end of the process's stderr; a dead or killed process
is started afresh by the next call. The server side is
tests/support/_serve_main.py."""
from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading

from tests.support.launch import ROOT

END = "\x1e"  # starts the line that ends a call's output: END + {"rc": ..., "error": ...}


class ServedError(AssertionError):
    pass


class _Server:
    def __init__(self, module: str, env: dict):
        self.module = module
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support._serve_main", module],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            env=env, cwd=ROOT, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the process closed its stdout: it ended

    def _stderr_tail(self, since: int) -> str:
        self.stderr.flush()
        self.stderr.seek(since)
        return self.stderr.read()[-4000:]

    def call(self, argv: list, timeout: float) -> str:
        since = self.stderr.seek(0, os.SEEK_END)
        self.proc.stdin.write(json.dumps([str(a) for a in argv]) + "\n")
        self.proc.stdin.flush()
        out = []
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.proc.kill()
                raise ServedError(f"{self.module} {argv}: no answer in {timeout} s\n"
                                  + self._stderr_tail(since)) from None
            if line is None:
                self.proc.wait()
                raise ServedError(f"{self.module} {argv}: the server ended (exit "
                                  f"{self.proc.returncode})\n" + self._stderr_tail(since))
            if line.startswith(END):
                status = json.loads(line[len(END):])
                if status["rc"] != 0:
                    raise ServedError(f"{self.module} {argv}: {status['error']}\n"
                                      + self._stderr_tail(since))
                return "".join(out)
            out.append(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_servers: dict[tuple, _Server] = {}


def served(module: str, env: dict) -> _Server:
    """This worker's server of `module` (importable with `env`), started on
    first use or after the previous one ended. pytest's own variables
    (PYTEST_CURRENT_TEST changes with every test) are not part of `env`."""
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
    key = (module, tuple(sorted(env.items())))
    server = _servers.get(key)
    if server is None or server.proc.poll() is not None:
        server = _servers[key] = _Server(module, env)
    return server


@atexit.register
def _close_all():
    for server in _servers.values():
        server.close()
