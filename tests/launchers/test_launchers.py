"""The AMP launchers (scripts/train_mnist_amp.py, scripts/train_imagenet_amp.py)
run end to end in subprocesses with tiny sizes; a resumed run equals an
uninterrupted one bit for bit; bad input gets one clear message."""
import json
import os
import re

import pytest
import torch


from tests.support import assert_same  # noqa: E402
from tests.support.launch import MNIST_TINY, launch, launch_side_by_side, summary  # noqa: E402
from xla_amp_launch import data, image_folder  # noqa: E402
from xla_amp_launch import digits as mnist_data  # noqa: E402


@pytest.mark.launchers  # over 30 s: make launchers
def test_mnist_resume_equals_uninterrupted_run(tmp_path):
    """31 steps + checkpoint (mid epoch 1), then resume to 50 (into epoch 2)
    == 50 steps straight: model, optimizer, scaler and data position equal."""
    a, b, c = (str(tmp_path / n) for n in ("a.pt", "b.pt", "c.pt"))
    logdir = tmp_path / "tb"
    # the first part and the uninterrupted run are independent: side by side
    first, straight = launch_side_by_side(
        ("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 31, "--checkpoint", a,
         "--target_accuracy", 99.9),
        ("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 50, "--checkpoint", c,
         "--logdir", logdir))
    # a short run misses the target: the summary says so and the exit status is 1
    assert first.returncode == 1, first.stderr[-3000:]
    assert "MISSED" in summary(first, "accuracy")
    assert "below --target_accuracy" in first.stderr
    resumed = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 50, "--resume", a,
                     "--checkpoint", b)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "step 31" in resumed.stdout
    assert straight.returncode == 0, straight.stderr[-3000:]

    sb, sc = (torch.load(p, weights_only=True) for p in (b, c))
    assert sc["position"] == {"epoch": 1, "step": 50 - 44, "global_step": 50}
    assert_same(sb["position"], sc["position"], "position")
    assert_same(sb["model"], sc["model"], "model")
    assert_same(sb["optimizer"], sc["optimizer"], "optimizer")
    assert_same(sb["scaler"], sc["scaler"], "scaler")
    assert sc["scaler"]["scale"] == 65536.0
    sa = torch.load(a, weights_only=True)
    assert not all(torch.equal(sa["model"][k], sc["model"][k]) for k in sc["model"])

    # the summary: accuracy, throughput, and one graph per step without host syncs
    acc = float(summary(straight, "accuracy").split("%")[0])
    assert 50.0 < acc <= 100.0          # 50 steps of real digits learn something
    assert "samples/s" in summary(straight, "throughput")
    xla = summary(straight, "XLA")
    m = re.match(r"(\d+) compilations?, ([\d.]+) graph executions/step, ([\d.]+) host syncs",
                 xla)
    assert m, xla
    compiles, execs, syncs = int(m.group(1)), float(m.group(2)), float(m.group(3))
    assert compiles == 1 and execs == 1.0  # the first step is every step's graph
    # reads: every 4th step and at the epoch end, nothing else
    assert syncs == pytest.approx((50 // 4 + 1) / 50)
    assert "AMP bfloat16" in straight.stdout and "xla_amp.syncfree.Adam" in straight.stdout

    # TensorBoard scalars
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ev = EventAccumulator(str(logdir))
    ev.Reload()
    tags = set(ev.Tags()["scalars"])
    assert {"train/loss", "train/accuracy", "train/loss_scale", "train/samples_per_sec",
            "eval/accuracy"} <= tags, tags
    assert ev.Scalars("train/loss_scale")[-1].value == 65536.0
    assert ev.Scalars("eval/accuracy")[-1].value == pytest.approx(acc, abs=0.01)


def test_mnist_idx_datadir_on_two_devices_spmd(tmp_path):
    """--datadir reads MNIST idx files (gzipped here, in torchvision's
    MNIST/raw/ below PyTorch/XLA's per-ordinal folder); --num_devices 2 trains
    SPMD data parallel, still one graph execution per step."""
    d = mnist_data.load_sklearn_digits()
    small = mnist_data.Digits(d.train_x[:256], d.train_y[:256], d.test_x[:50],
                              d.test_y[:50], "subset")
    # PyTorch/XLA's MNIST launcher downloads into DATADIR/<ordinal>/MNIST/raw
    mnist_data.write_mnist_idx(str(tmp_path / "0" / "MNIST" / "raw"), small, gz=True)
    back = mnist_data.load_mnist_idx(str(tmp_path / "0"))
    assert back.train_x.shape == (256, 1, 28, 28) and torch.equal(back.train_y, small.train_y)
    assert (back.train_x - small.train_x).abs().max() <= 0.5 / 255 + 1e-6

    proc = launch("train_mnist_amp.py", "--datadir", tmp_path, "--num_devices", 2,
                  "--batch_size", 32, "--eval_batch_size", 32, "--num_epochs", 1,
                  "--max_steps", 5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 x CPU (SPMD data parallel)" in proc.stdout
    assert "MNIST idx files" in proc.stdout and "256 training / 50 held-out" in proc.stdout
    assert "(50 images)" in summary(proc, "accuracy")
    assert "1.00 graph executions/step" in summary(proc, "XLA")


def test_mnist_bad_datadir_is_one_clear_message(tmp_path):
    missing = tmp_path / "nope"
    proc = launch("train_mnist_amp.py", "--datadir", missing)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and str(missing) in err[0] and "train-images-idx3-ubyte" in err[0]


@pytest.mark.parametrize("problem", ["no_files", "bad_magic", "truncated", "count_mismatch"])
def test_mnist_malformed_datadir_names_path_and_layout(tmp_path, problem):
    d = mnist_data.load_sklearn_digits()
    small = mnist_data.Digits(d.train_x[:20], d.train_y[:20], d.test_x[:10], d.test_y[:10], "s")
    mnist_data.write_mnist_idx(str(tmp_path), small)
    images = tmp_path / "train-images-idx3-ubyte"
    if problem == "no_files":
        os.remove(tmp_path / "t10k-labels-idx1-ubyte")
        expect = "has no t10k-labels-idx1-ubyte"
    elif problem == "bad_magic":
        raw = bytearray(images.read_bytes())
        raw[3] = 0x01
        images.write_bytes(bytes(raw))
        expect = "magic number 0x00000801, expected 0x00000803"
    elif problem == "truncated":
        images.write_bytes(images.read_bytes()[:-7])
        expect = "declares shape (20, 28, 28)"
    else:
        labels = tmp_path / "train-labels-idx1-ubyte"
        import struct
        lab = bytes(range(10)) * 3
        labels.write_bytes(struct.pack(">II", 0x801, len(lab)) + lab)
        expect = "20 train images but 30 train labels"
    with pytest.raises(mnist_data.DataDirError) as e:
        mnist_data.load_mnist_idx(str(tmp_path))
    msg = str(e.value)
    assert expect in msg and str(tmp_path) in msg and "expected the four MNIST idx files" in msg


def _image_folder(root, classes=("cat", "dog"), train=6, val=3, size=(40, 48)):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("val", val)):
        for c in classes:
            os.makedirs(root / split / c, exist_ok=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, size + (3,), dtype=np.uint8)).save(
                    root / split / c / f"{i}.png")


# PyTorch/XLA's launchers' command lines (test/test_train_mp_{mnist,imagenet}_amp.py)
MNIST_PTXLA = ["--use_syncfree_optim", "--num_cores=1", "--batch_size=32", "--num_epochs=1",
               "--num_steps=3", "--test_set_batch_size=160", "--drop_last", "--log_steps=4",
               "--metrics_debug"]
IMAGENET_PTXLA = ["--model=resnet18", "--fake_data", "--num_steps=2", "--batch_size=2",
                  "--test_set_batch_size=2", "--drop_last", "--num_workers=0",
                  "--use_syncfree_optim", "--metrics_debug"]


def assert_metrics_report(proc):
    """--metrics_debug: torch_xla's metrics report after each epoch's line."""
    report = proc.stdout.split("epoch 1/", 1)[-1].split("=" * 28 + " summary", 1)[0]
    assert "Metric: CompileTime" in report and "Metric: ExecuteTime" in report, proc.stdout


@pytest.mark.parametrize("policy", [
    "tpu", pytest.param("cuda", marks=pytest.mark.launchers)])  # cuda (float16): make launchers
def test_mnist_trains_under_every_policy(policy):
    """cuda: with its default float16 (slow on XLA:CPU: a few steps only).
    tpu: with bf16 weights and an fp32 master copy (--precision bf16_master)
    and an fp32 rule on a layer whose weights are bf16 (--module_policy); the
    optimizer modes themselves are tested in tests/syncfree/test_low_precision.py.
    The tpu run is spelled as PyTorch/XLA's MNIST launcher's command line:
    3 steps per epoch (--num_steps), 3 evaluation batches of 160 of the 360
    held-out images, the partial third one dropped (--drop_last): 320."""
    if policy == "tpu":
        args = [*MNIST_PTXLA, "--precision", "bf16_master", "--module_policy", "fc2=fp32"]
    else:
        # 3 steps and 3 evaluation batches of 8 (--num_steps): XLA:CPU runs
        # float16 convolutions in emulated half, a step of 32 images 4.6 s
        args = [*MNIST_TINY, "--max_steps", 3, "--num_steps", 3, "--batch_size", 8,
                "--eval_batch_size", 8]
    proc = launch("train_mnist_amp.py", *args, "--policy", policy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dtype = "float16" if policy == "cuda" else "bfloat16"
    assert f"AMP {dtype} (policy {policy})" in proc.stdout, proc.stdout
    if policy == "tpu":
        assert "bf16 weights" in proc.stdout and "module policies fc2=fp32" in proc.stdout
        assert "xla_amp.syncfree.Adam" in proc.stdout and "3 steps/epoch" in proc.stdout
        assert "(320 images)" in summary(proc, "accuracy")
        assert "3 steps" in summary(proc, "throughput")
        assert_metrics_report(proc)
    assert "1.00 graph executions/step" in summary(proc, "XLA")


def test_mnist_precision_fp32_alone_is_noamp():
    """--precision fp32 is --noamp, as the docs say (it used to be refused
    unless --noamp came with it): no autocast, no GradScaler."""
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 2, "--precision", "fp32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^precision\s+fp32$", proc.stdout, re.M), proc.stdout
    assert "loss scale" not in proc.stdout


@pytest.mark.parametrize("policy", [None, "cuda"])  # None: XLA:CPU -> cpu rules
def test_imagenet_resnet_trains_under_every_policy(policy, tmp_path):
    """ResNet's bn -> relu -> max_pool under the cuda/cpu rules (batch_norm
    uncast, bf16 input with fp32 weights) used to fail XLA's verifier in the
    first backward; the engine's XLA adaptations make every policy train.
    The cuda run also writes --precision_report: fp16 at the initial scale
    2**16 overflows ResNet-18's gradients, so its first steps are skipped."""
    # the default policy's run is spelled as PyTorch/XLA's ImageNet launcher's command line
    args = (IMAGENET_PTXLA if policy is None else
            ["--model", "resnet18", "--batch_size", 2, "--max_steps", 2, "--policy", policy,
             "--precision_report", "--logdir", tmp_path, "--log_steps", 1])
    proc = launch("train_imagenet_amp.py", *args, "--image_size", 32, "--num_classes", 10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "n/a (fake data)" in summary(proc, "accuracy")
    assert "note: using the 'tpu'" not in proc.stdout
    assert "1.00 graph executions/step" in summary(proc, "XLA")
    if policy is None:
        assert "xla_amp.syncfree.SGD" in proc.stdout and "2 steps/epoch" in proc.stdout
        assert_metrics_report(proc)
    else:
        report = json.loads((tmp_path / "precision_report.json").read_text())
        rows = {(r["module"], r["op"]): r for r in report["rows"]}
        assert report["policy"] == "cuda" and report["dtype"] == "float16"
        assert rows[("layer1.0.conv1", "aten::conv2d")]["dtype"] == "float16"
        assert rows[("bn1", "aten::batch_norm")]["category"] == "fp32_compute"
        assert "| layer4.1.conv2 | aten::conv2d |" in (tmp_path / "precision_report.md").read_text()
        overflow = json.loads((tmp_path / "overflow_report.json").read_text())
        assert "conv1.weight" in overflow["parameters"] and overflow["skipped_total"] >= 1
        assert "inf/NaN gradients in: conv1.weight" in proc.stdout


def _executions(proc):
    return float(re.search(r"([\d.]+) graph executions/step", summary(proc, "XLA")).group(1))


@pytest.mark.launchers  # over make test's 15 s guard: make launchers
def test_mnist_compile_flag():
    """--compile: forward + loss through torch.compile(backend="openxla"),
    the rest lazily; still no host sync in a step (the one read per
    --log_steps aside) and the same loss as the lazy run to bf16 rounding."""
    args = [*MNIST_TINY, "--max_steps", 8, "--policy", "tpu"]
    runs = launch_side_by_side(*[("train_mnist_amp.py", *args, *extra)
                                 for extra in ([], ["--compile"])])
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "forward + loss compiled" in runs[1].stdout
    assert "forward + loss compiled" not in runs[0].stdout
    # forward, its grad input, backward, the rest (lazy: all in one)
    assert [_executions(p) for p in runs] == [1.0, 4.0]
    syncs = [re.search(r"([\d.]+) host syncs/step", summary(p, "XLA")).group(1) for p in runs]
    assert syncs[0] == syncs[1]
    losses = [float(re.search(r"train loss ([\d.]+)", p.stdout).group(1)) for p in runs]
    assert losses[1] == pytest.approx(losses[0], rel=2e-2), losses


@pytest.mark.launchers  # over make test's 15 s guard: make launchers
def test_imagenet_compile_flag():
    proc = launch("train_imagenet_amp.py", "--model", "resnet18", "--image_size", 32,
                  "--batch_size", 2, "--max_steps", 2, "--num_classes", 10, "--compile")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "forward + loss compiled" in proc.stdout
    assert 4 <= _executions(proc) <= 5  # first step: also the optimizer state's creation


@pytest.mark.launchers  # over make test's 15 s guard: make launchers
def test_imagenet_image_folder_run(tmp_path):
    _image_folder(tmp_path / "data")
    proc = launch("train_imagenet_amp.py", "--datadir", tmp_path / "data",
                  "--model", "resnet18", "--image_size", 32, "--batch_size", 4,
                  "--num_epochs", 1, "--num_workers", 0, "--checkpoint", tmp_path / "ck.pt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "12 training / 6 held-out images, 2 classes, 32x32 crops" in proc.stdout
    assert "resnet18, 11,177,538 parameters" in proc.stdout
    assert "(6 images)" in summary(proc, "accuracy")
    assert "3 steps" in summary(proc, "throughput")
    assert "1.00 graph executions/step" in summary(proc, "XLA")
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    assert ck["position"] == {"epoch": 1, "step": 0, "global_step": 3}
    assert ck["model"]["fc.weight"].shape == (2, 512)


def test_image_folder_errors_name_path_and_layout(tmp_path):
    with pytest.raises(data.DataDirError, match="has no train/ directory"):
        image_folder.load_image_folders(str(tmp_path), 32, 0)
    (tmp_path / "train" / "cat").mkdir(parents=True)
    with pytest.raises(data.DataDirError) as e:
        image_folder.load_image_folders(str(tmp_path), 32, 0)
    assert "is not usable" in str(e.value) and "DATADIR/train/<class>/<image>" in str(e.value)
    _image_folder(tmp_path / "mixed", train=1, val=1)
    os.rename(tmp_path / "mixed" / "val" / "dog", tmp_path / "mixed" / "val" / "fox")
    with pytest.raises(data.DataDirError, match="different class folders"):
        image_folder.load_image_folders(str(tmp_path / "mixed"), 32, 0)


def test_epoch_order_and_augmentation_depend_on_seed_and_epoch_only():
    a = data.epoch_order(100, 3, 5)
    assert torch.equal(a, data.epoch_order(100, 3, 5))
    assert not torch.equal(a, data.epoch_order(100, 3, 6))
    assert sorted(a.tolist()) == list(range(100))
    x = torch.rand(200, 1, 28, 28)
    y = torch.arange(200)
    src = data.TensorSource(x, y, 16, seed=3, augment=mnist_data.random_shift)
    full = list(src.batches(2, 0))
    tail = list(src.batches(2, 5))
    assert len(full) == 12 and len(tail) == 7
    for (xa, ya), (xb, yb) in zip(full[5:], tail):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.launchers  # over 30 s: make launchers
def test_mnist_fp8_flag_and_resume_check(tmp_path):
    """--fp8: fc1 in fp8 (delayed scaling), the 10-way head kept; one graph
    execution a step; it learns; a checkpoint written with --fp8 is refused,
    naming the flag, by a run without it."""
    ck = tmp_path / "ck.pt"
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 40, "--fp8",
                  "--checkpoint", ck)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("fp8 (delayed scaling): 1 Linear layers converted; kept in high precision "
            "(dimensions not multiples of 16): fc2") in proc.stdout
    assert _executions(proc) == 1.0
    assert float(re.search(r"held-out acc ([\d.]+)%", proc.stdout).group(1)) > 50.0
    refused = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 41, "--resume", ck)
    assert refused.returncode == 2
    assert "written with --fp8 --fp8_scaling delayed, this run has no --fp8" in refused.stderr
