"""The launchers' --device gpu and --spmd on XLA:CPU.

--device gpu runs xla_amp.gpu.use_cuda_plugin and then the one-device SPMD
path that --spmd runs here: XLA:CPU in SPMD mode, one logical device, the
cuda policy forced, stands in for XLA:GPU through the plugin.
"""
from tests.support.launch import MNIST_TINY, launch, summary
from xla_amp.gpu import _requirements


def test_mnist_spmd_one_device_as_on_gpu():
    """The cuda rules in SPMD mode on one device (bfloat16: float16
    convolutions are slow on XLA:CPU; its SPMD run is in
    tests/gpu/test_gpu_spmd_mode.py): one graph execution and no host sync per
    step, the batch sharded over a mesh of one."""
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--log_steps", 8,
                  "--spmd", "--policy", "cuda", "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AMP bfloat16 (policy cuda)" in proc.stdout, proc.stdout
    xla = summary(proc, "XLA")
    assert "1.00 graph executions/step" in xla and "0.12 host syncs/step" in xla, xla


def test_device_gpu_names_what_is_missing():
    """--device gpu on a machine without the plugin: one error line (no
    traceback) naming each missing piece; the run never starts."""
    problems = _requirements.find().problems
    proc = launch("train_mnist_amp.py", "--device", "gpu", "--max_steps", 1, PJRT_DEVICE="")
    if not problems:  # a GPU machine with the plugin: it trains there
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "CUDA" in proc.stdout
        return
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "error: --device gpu: XLA:GPU cannot start" in proc.stderr
    for p in problems:
        assert p in proc.stderr
