"""torch_xla 2.9 ends the process (segmentation fault) on nll_loss of an
unbatched input: logits of shape [C] with a 0-dim class index, the form
F.cross_entropy and nn.CrossEntropyLoss document for one sample. The crash
is in tracing, without autocast and without xla_amp imported. Pinned: the
first test fails once upstream changes; then update
docs/upstream/torch_xla_unbatched_nll_loss.md and the module sweep
(tests/policies/test_module_sweep.py), which leaves these samples out."""
import signal
import subprocess
import sys

import torch
import torch.nn.functional as F

import xla_amp

from tests.support import launch

_CALL = """
import torch, torch_xla
import torch.nn.functional as F
d = torch_xla.device()
logits, target = torch.randn(5).to(d), torch.tensor(2).to(d)
print("traced", F.cross_entropy(logits, target).shape, flush=True)
"""


def test_unbatched_cross_entropy_ends_the_process():
    # cross_entropy's class-index path is log_softmax + nll_loss: the crash is
    # nll_loss's (a script calling F.nll_loss alone crashes the same way)
    proc = subprocess.run([sys.executable, "-c", _CALL], capture_output=True, text=True,
                          env=launch.launch_env(), timeout=120, cwd=launch.ROOT)
    assert proc.returncode == -signal.SIGSEGV and "traced" not in proc.stdout, (
        proc.returncode, proc.stdout, proc.stderr[-2000:])


def test_a_batch_of_one_is_the_workaround(device):
    """The same loss with the sample as a batch of one, in and out of a region."""
    torch.manual_seed(0)
    logits, target = torch.randn(5), torch.tensor(2)
    want = F.cross_entropy(logits, target)
    got = F.cross_entropy(logits[None].to(device), target[None].to(device))
    assert torch.allclose(got.cpu(), want, rtol=1e-6), (got, want)
    x, t = logits[None].half().to(device), target[None].to(device)
    with xla_amp.autocast(device, policy="cuda", dtype=torch.float16):
        low = F.cross_entropy(x, t)
    # as on CUDA: log_softmax in the input's float16 (cross_entropy passes the
    # input's dtype), nll_loss in float32
    control = F.nll_loss(F.log_softmax(x, 1, dtype=torch.float16).float(), t)
    assert low.dtype == torch.float32 and torch.equal(low.cpu(), control.cpu()), (low, control)
