"""A full and a read-only disk under a running launcher, for real (make
faults): a small tmpfs, and a tmpfs remounted read-only mid-run, each in a
private mount namespace (`unshare -m`, root); where the machine allows
neither, RLIMIT_FSIZE makes the write fail instead (EFBIG). Each time: one
line naming the path and the OS reason, exit status 74, the previous
checkpoint intact, no temporary file left. (Root ignores chmod, so EACCES
is not provoked here.)"""
import os
import resource
import shlex
import subprocess

import pytest
import torch

from tests.support.faults import in_mount_namespace, mount_namespaces_work
from tests.support.launch import ROOT, command, launch_env

pytestmark = pytest.mark.faults

ARGS = ["--batch_size", 32, "--num_epochs", 1, "--eval_batch_size", 120, "--log_steps", 5]
NAMESPACES = mount_namespaces_work()


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def check_stopped_cleanly(rc, err, directory, path, reason, step, named=None):
    """`path` is read here (a copy, for a namespace's tmpfs); `named` is the
    path the launcher wrote (default `path`)."""
    assert rc == 74, err[-3000:]
    lines = error_lines(err)
    assert len(lines) == 1, err[-3000:]
    assert str(named or path) in lines[0] and reason in lines[0], lines[0]
    assert "the previous checkpoint is intact" in lines[0]
    assert "Traceback" not in err
    names = set(os.listdir(directory))
    assert not [n for n in names if n.endswith(".tmp")], names
    state = torch.load(path, weights_only=True)
    assert state["position"]["global_step"] == step


def namespace_run(tmp_path, mount_dir, body: str):
    """Run `body` (bash) in a private mount namespace with a tmpfs at
    `mount_dir`; returns (rc of the launcher, stdout, stderr) and leaves a
    copy of the tmpfs in tmp_path/after."""
    after = tmp_path / "after"
    script = f"""
set -u
mkdir -p {mount_dir} {after}
{body}
cp -a {mount_dir}/. {after}/
"""
    proc = in_mount_namespace(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rc = int((tmp_path / "rc").read_text())
    return rc, (tmp_path / "out").read_text(), (tmp_path / "err").read_text(), after


def launcher(*args) -> str:
    return shlex.join(command("train_mnist_amp.py", *ARGS, *args))


@pytest.mark.skipif(not NAMESPACES, reason="no private mount namespace here: the "
                    "RLIMIT_FSIZE test stands in")
def test_disk_full_during_a_periodic_save(tmp_path):
    """A 24 MB tmpfs holds one ~14 MB checkpoint but not a second beside it:
    the save at step 10 fails with ENOSPC; the step-5 checkpoint stays."""
    d = tmp_path / "mnt"
    body = (f"mount -t tmpfs -o size=24m tmpfs {d}\n"
            f"cd {ROOT} && {launcher('--checkpoint', d / 'ck.pt', '--checkpoint_steps', 5, '--max_steps', 20)}"
            f" > {tmp_path}/out 2> {tmp_path}/err; echo $? > {tmp_path}/rc")
    rc, out, err, after = namespace_run(tmp_path, d, _with_env(body))
    check_stopped_cleanly(rc, err, after, after / "ck.pt", "No space left on device [ENOSPC]", 5,
                          named=d / "ck.pt")


@pytest.mark.skipif(not NAMESPACES, reason="no private mount namespace here: the "
                    "RLIMIT_FSIZE test stands in")
def test_disk_turns_read_only_mid_run(tmp_path):
    """The tmpfs is remounted read-only after the first checkpoint (as a
    file system that hits an error does): the next save fails with EROFS."""
    d = tmp_path / "mnt"
    body = (f"mount -t tmpfs -o size=200m tmpfs {d}\n"
            f"cd {ROOT} && ({launcher('--checkpoint', d / 'ck.pt', '--checkpoint_steps', 3, '--max_steps', 40)}"
            f" > {tmp_path}/out 2> {tmp_path}/err; echo $? > {tmp_path}/rc) &\n"
            f"while [ ! -e {d}/ck.pt ]; do sleep 0.02; done\n"
            # a writer may have its temporary file open: retry until it is not
            f"until mount -o remount,ro {d} 2>/dev/null; do sleep 0.01; done\n"
            "wait\n")
    rc, out, err, after = namespace_run(tmp_path, d, _with_env(body))
    state = torch.load(after / "ck.pt", weights_only=True)
    step = state["position"]["global_step"]
    assert 3 <= step < 40 and step % 3 == 0
    check_stopped_cleanly(rc, err, after, after / "ck.pt", "Read-only file system [EROFS]", step,
                          named=d / "ck.pt")


def test_file_size_limit_during_a_save(tmp_path):
    """RLIMIT_FSIZE below the checkpoint's size (what any machine allows):
    a resumed run's first save fails with EFBIG; the file it resumed from
    is intact."""
    path = tmp_path / "ck.pt"
    env = launch_env()
    first = subprocess.run(command("train_mnist_amp.py", *ARGS, "--checkpoint", path,
                                   "--max_steps", 4), capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    second = subprocess.run(command("train_mnist_amp.py", *ARGS, "--checkpoint", path,
                                    "--auto_resume", "--checkpoint_steps", 2, "--max_steps", 12),
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
                            preexec_fn=limit)
    check_stopped_cleanly(second.returncode, second.stderr, tmp_path, path,
                          "File too large [EFBIG]", 4)


def _with_env(body: str) -> str:
    env = launch_env()
    exports = "".join(f"export {k}={shlex.quote(env[k])}\n"
                      for k in ("PJRT_DEVICE", "XLA_FLAGS", "PATH") if k in env)
    return exports + body
