"""The launchers' flags, parsed without training: PyTorch/XLA's spellings
set ours, and bad values are one usage error each (no traceback)."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.launch import ROOT, SCRIPTS, launch


@pytest.mark.parametrize("script,args,expect", [
    ("train_mnist_amp.py", ["--optimizer", "rmsprop"], "--optimizer"),
    ("train_mnist_amp.py", ["--num_devices", 2, "--batch_size", 33], "multiples of --num_devices"),
    ("train_imagenet_amp.py", ["--model", "resnet_nope"], "--model must be a torchvision"),
    ("train_mnist_amp.py", ["--module_policy", "LayerNorm:fp32"], "--module_policy"),
    ("train_mnist_amp.py", ["--module_policy", "head=nope"], "--module_policy"),
    ("train_mnist_amp.py", ["--noamp", "--precision", "bf16_master"], "--noamp is --precision fp32"),
    ("train_mnist_amp.py", ["--nosyncfree", "--precision", "bf16_sr"], "sync-free optimizers"),
    ("train_mnist_amp.py", ["--precision", "fp32", "--dtype", "bf16"], "--dtype applies to autocast only"),
    ("train_mnist_amp.py", ["--fsdp"], "--fsdp shards over --num_devices devices"),
    ("train_mnist_amp.py", ["--fp8", "--precision", "bf16_master"], "--fp8 takes float32 weights"),
])
def test_bad_flag_values_are_usage_errors(script, args, expect):
    """...before torch is imported (2 s; torch_xla 5 s more), where checking
    the flags does not need it: the --model check needs torchvision's list."""
    proc = launch(script, *args, PYTHONPROFILEIMPORTTIME="1")  # python -X importtime
    assert proc.returncode == 1
    assert "FATAL Flags parsing error" in proc.stderr and expect in proc.stderr
    assert "Traceback" not in proc.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "absl.flags" in imported  # (the profile is there to read)
    assert ("torch" in imported) == (expect == "--model must be a torchvision"), expect


PARSE = """
import importlib.util, json, sys
from absl import flags
spec = importlib.util.spec_from_file_location("launcher", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
values = []
for argv in json.loads(sys.argv[2]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS([sys.argv[1], *argv])
    values.append({name: flags.FLAGS[name].value for name in flags.FLAGS})
print(json.dumps(values))
"""


def parse_flags(script, *command_lines):
    """Each command line's flag values, as the launcher parses them (one
    process; the launcher's flags are defined, its main() not run)."""
    proc = subprocess.run([sys.executable, "-c", PARSE, os.path.join(SCRIPTS, script),
                           json.dumps(command_lines)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


# PyTorch/XLA's flag -> (our flag, the value their command line gives it)
PTXLA_FLAGS = {
    "use_syncfree_optim": ("syncfree", True), "num_cores": ("num_devices", 2),
    "test_set_batch_size": ("eval_batch_size", 8), "num_steps": ("num_steps", 3),
    "log_steps": ("log_steps", 1), "metrics_debug": ("metrics_debug", True),
    "drop_last": ("drop_last", True), "num_workers": ("num_workers", 4),
    "batch_size": ("batch_size", 16), "num_epochs": ("num_epochs", 18),
    "lr": ("lr", 0.01), "momentum": ("momentum", 0.5), "target_accuracy": ("target_accuracy", 98.0),
    "logdir": ("logdir", "/tmp/tb"), "datadir": ("datadir", "/tmp/mnist-data"),
}


@pytest.mark.parametrize("script", ["train_mnist_amp.py", "train_imagenet_amp.py"])
def test_pytorch_xla_flags_set_ours(script):
    """Their spelling (`--flag` for their store_true flags, `--flag=value`)
    sets the value of ours; aliases parse in order with our own name."""
    theirs = ["--use_syncfree_optim" if f == "use_syncfree_optim" else
              f"--{f}" if v is True else f"--{f}={v}" for f, (_, v) in PTXLA_FLAGS.items()]
    extra = ["--model=resnet18", "--amp"] if "imagenet" in script else []
    full, faked, syncfree_off, syncfree_on, default = parse_flags(
        script, ["--nosyncfree", *theirs, *extra], ["--fake_data"],
        ["--use_syncfree_optim", "--nouse_syncfree_optim"],
        ["--nosyncfree", "--use_syncfree_optim"], [])
    for flag, (ours, value) in PTXLA_FLAGS.items():
        assert full[ours] == value, (flag, ours, full[ours])
        assert full[flag] == value  # an alias reads as its flag
    assert faked["fake_data"] is True
    assert syncfree_off["syncfree"] is False and syncfree_on["syncfree"] is True
    assert default["syncfree"] is True and default["num_devices"] == 1
    assert default["num_steps"] is None and not default["drop_last"]
    assert not default["metrics_debug"]
    if extra:
        assert full["model"] == "resnet18" and full["amp"] is True
