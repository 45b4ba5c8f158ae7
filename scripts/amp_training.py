"""Shared machinery of the AMP launchers (``train_mnist_amp.py``,
``train_imagenet_amp.py``): flags, device set-up, data sources, the training
loop, checkpoints, progress and the final summary.

The loop is the pattern the launchers exist to show::

    with xla_amp.autocast(device):             # bf16 (or fp16) where the policy says
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()              # xla_amp.GradScaler
    scaler.step(optimizer)                     # xla_amp.syncfree.SGD/Adam/AdamW: no host sync
    scaler.update()
    torch_xla.sync()                           # one graph execution per step

Loss, accuracy and the loss scale are accumulated on the device inside that
same graph and read back once per ``--log_steps`` steps (one device-to-host
transfer), so the host never waits on the device in between. The summary
reports, from ``torch_xla.debug.metrics``, how many compilations, graph
executions and device-to-host transfers the training steps really cost.

Checkpoints (``--checkpoint``) hold the model, optimizer and scaler state and
the data position (epoch, step within the epoch). Each epoch's sample order
is a permutation drawn from ``--seed`` and the epoch number alone, so a run
resumed with ``--resume`` takes exactly the batches, and produces exactly the
parameters, of an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Callable, Iterator, Optional

from absl import flags

FLAGS = flags.FLAGS

OPTIMIZERS = ("sgd", "adam", "adamw")
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


# ----------------------------------------------------------------- flags


def define_flags(*, batch_size: int, num_epochs: int, lr: float, optimizer: str = "sgd",
                 momentum: float = 0.9, weight_decay: float = 0.0, log_steps: int = 10,
                 fake_data: bool = False, eval_batch_size: Optional[int] = None,
                 lr_schedule: str = "constant") -> None:
    """Define the launchers' common flags, with per-launcher defaults."""
    # Policy names come from xla_amp; importing it does not start the runtime.
    from xla_amp import policies

    flags.DEFINE_bool("amp", True, "Train with automatic mixed precision "
                      "(xla_amp.autocast + xla_amp.GradScaler); --noamp trains in fp32.")
    flags.DEFINE_enum("dtype", None, sorted(DTYPES),
                      "Lower-precision dtype under autocast (default: the policy's, "
                      "bfloat16 on TPU and CPU, float16 on GPU).")
    flags.DEFINE_enum("policy", None, sorted(policies.names()),
                      "Autocast policy (op lists) to apply (default: the device's).")
    flags.DEFINE_enum("optimizer", optimizer, list(OPTIMIZERS), "Optimizer.")
    flags.DEFINE_bool("syncfree", True, "Use xla_amp.syncfree optimizers (the step is "
                      "skipped on overflow inside the graph); --nosyncfree uses torch.optim, "
                      "which costs a host sync per step under GradScaler.")
    flags.DEFINE_integer("batch_size", batch_size, "Global training batch size.", lower_bound=1)
    flags.DEFINE_integer("eval_batch_size", eval_batch_size,
                         "Evaluation batch size (default: --batch_size).", lower_bound=1)
    flags.DEFINE_integer("num_epochs", num_epochs, "Number of epochs.", lower_bound=1)
    flags.DEFINE_float("lr", lr, "Learning rate.", lower_bound=0.0)
    flags.DEFINE_enum("lr_schedule", lr_schedule, ["constant", "cosine"],
                      "Learning rate schedule, a function of the global step alone "
                      "(so a resumed run follows it exactly): cosine decays --lr to 0 "
                      "over --num_epochs after --warmup_steps of linear warm-up.")
    flags.DEFINE_integer("warmup_steps", 0, "Linear learning-rate warm-up steps.",
                         lower_bound=0)
    flags.DEFINE_float("momentum", momentum, "SGD momentum.", lower_bound=0.0)
    flags.DEFINE_float("weight_decay", weight_decay, "Weight decay.", lower_bound=0.0)
    flags.DEFINE_integer("seed", 1, "Seed of the initial weights and of the data order.")
    flags.DEFINE_bool("fake_data", fake_data, "Train on a fixed random batch "
                      "(throughput only; no accuracy).")
    flags.DEFINE_string("datadir", None, "Directory of the real data set.")
    flags.DEFINE_string("logdir", None, "Write TensorBoard scalars (loss, accuracy, "
                        "loss scale, samples/s) here.")
    flags.DEFINE_integer("num_devices", 1, "Devices to train on, data parallel with SPMD "
                         "(the batch is sharded; the compiler inserts the gradient "
                         "reductions). On XLA:CPU sets CPU_NUM_DEVICES.", lower_bound=1)
    flags.DEFINE_string("checkpoint", None, "Save a checkpoint to this file at the end of "
                        "each epoch, every --checkpoint_steps steps, and at the end.")
    flags.DEFINE_integer("checkpoint_steps", 0, "Also checkpoint every this many steps "
                         "(0: only at epoch ends and at the end).", lower_bound=0)
    flags.DEFINE_string("resume", None, "Resume from this checkpoint file: model, optimizer, "
                        "scaler and data position.")
    flags.DEFINE_float("target_accuracy", None, "Exit with status 1 unless the final "
                       "held-out accuracy (percent) reaches this.",
                       lower_bound=0.0, upper_bound=100.0)
    flags.DEFINE_integer("max_steps", 0, "Stop after this many training steps in total "
                         "(counted from the start of training, across resumes; 0: no limit).",
                         lower_bound=0)
    flags.DEFINE_integer("log_steps", log_steps, "Read loss/accuracy/scale back from the "
                         "device (one transfer) every this many steps.", lower_bound=1)
    flags.DEFINE_bool("progress", True, "Show a progress bar per epoch.")

    flags.register_validator("resume", lambda p: p is None or os.path.isfile(p),
                             message="--resume must name an existing checkpoint file")
    flags.register_multi_flags_validator(
        ["fake_data", "datadir"], lambda f: not (f["fake_data"] and f["datadir"]),
        message="--fake_data and --datadir exclude each other")
    flags.register_multi_flags_validator(
        ["fake_data", "target_accuracy"],
        lambda f: not (f["fake_data"] and f["target_accuracy"] is not None),
        message="--target_accuracy needs real data (fake data has no accuracy)")
    flags.register_multi_flags_validator(
        ["amp", "dtype"], lambda f: f["amp"] or f["dtype"] is None,
        message="--dtype applies to --amp only")
    flags.register_multi_flags_validator(
        ["batch_size", "eval_batch_size", "num_devices"],
        lambda f: f["batch_size"] % f["num_devices"] == 0
        and (f["eval_batch_size"] or f["batch_size"]) % f["num_devices"] == 0,
        message="--batch_size and --eval_batch_size must be multiples of --num_devices")


# ----------------------------------------------------------------- device


@dataclasses.dataclass
class Devices:
    device: object               # the XLA device to put tensors on
    mesh: object = None          # SPMD mesh over the data axis, or None
    count: int = 1
    hw: str = "?"

    def shard(self, t):
        """Shard a batch tensor along its first dimension over the mesh."""
        if self.mesh is not None:
            import torch_xla.distributed.spmd as xs
            xs.mark_sharding(t, self.mesh, ("data",) + (None,) * (t.dim() - 1))
        return t


def setup_devices(num_devices: int) -> Devices:
    """Start the XLA runtime; for ``num_devices > 1`` in SPMD mode over a
    one-axis ("data") mesh. Must run before anything touches a device."""
    if num_devices > 1:
        pjrt = os.environ.get("PJRT_DEVICE", "CPU")
        if pjrt.upper() == "CPU":
            have = os.environ.get("CPU_NUM_DEVICES")
            if have is not None and have != str(num_devices):
                raise SystemExit(f"error: --num_devices={num_devices} but the environment "
                                 f"sets CPU_NUM_DEVICES={have}; unset it or make them agree.")
            os.environ["CPU_NUM_DEVICES"] = str(num_devices)
            os.environ.setdefault("PJRT_DEVICE", "CPU")
    import numpy as np
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if num_devices == 1:
        dev = torch_xla.device()
        return Devices(dev, None, 1, xm.xla_device_hw(dev))
    xr.use_spmd()
    import torch_xla.distributed.spmd as xs
    have = xr.global_runtime_device_count()
    if have != num_devices:
        raise SystemExit(f"error: --num_devices={num_devices} but the runtime has {have} "
                         "devices; SPMD data parallelism here spans all of them.")
    mesh = xs.Mesh(np.arange(num_devices), (num_devices,), ("data",))
    dev = torch_xla.device()
    return Devices(dev, mesh, num_devices, xm.xla_device_hw(dev))


# ----------------------------------------------------------------- data


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True):
    """The sample order of one epoch: a function of (seed, epoch) only."""
    import torch
    if not shuffle:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=g)


class TensorSource:
    """Batches of in-memory CPU tensors in a per-epoch order; the ragged tail
    of an epoch is dropped so that every step has the same shape (one graph).

    ``augment(x, generator)``, if given, transforms each batch with random
    numbers from a generator seeded by (seed, epoch, step): the augmentation,
    too, is the same in a resumed run as in an uninterrupted one."""

    def __init__(self, x, y, batch_size: int, seed: int, shuffle: bool = True,
                 transform: Optional[Callable] = None, augment: Optional[Callable] = None):
        if len(y) < batch_size:
            raise ValueError(f"the training set has {len(y)} samples, fewer than one "
                             f"batch (--batch_size={batch_size})")
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.shuffle, self.transform, self.augment = shuffle, transform, augment
        self.steps_per_epoch = len(y) // batch_size
        self.num_samples = len(y)

    def batches(self, epoch: int, start: int) -> Iterator:
        import torch
        order = epoch_order(len(self.y), self.seed, epoch, self.shuffle)
        b = self.batch_size
        for i in range(start, self.steps_per_epoch):
            idx = order[i * b:(i + 1) * b]
            x = self.x[idx]
            if self.augment is not None:
                g = torch.Generator().manual_seed((self.seed * 100_003 + epoch) * 100_003 + i)
                x = self.augment(x, g)
            yield (self.transform(x) if self.transform else x), self.y[idx]


class FakeSource:
    """One fixed random batch, made on the device once and reused each step."""

    def __init__(self, shape, num_classes: int, batch_size: int, steps_per_epoch: int,
                 devices: Devices, seed: int):
        import torch
        g = torch.Generator().manual_seed(seed)
        self.x = devices.shard(torch.randn((batch_size,) + tuple(shape), generator=g)
                               .to(devices.device))
        self.y = devices.shard(torch.randint(0, num_classes, (batch_size,), generator=g)
                               .to(devices.device))
        self.steps_per_epoch = steps_per_epoch
        self.num_samples = steps_per_epoch * batch_size
        self.batch_size = batch_size

    def batches(self, epoch: int, start: int) -> Iterator:
        for _ in range(start, self.steps_per_epoch):
            yield self.x, self.y


def padded_eval_batches(x, y, batch_size: int, transform: Optional[Callable] = None):
    """Fixed-size evaluation batches of in-memory tensors: the last one is
    padded and carries a mask, so evaluation compiles one graph."""
    for i in range(0, len(y), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        yield pad_batch(transform(xb) if transform else xb, yb, batch_size)


def pad_batch(xb, yb, batch_size: int):
    import torch
    n = len(yb)
    mask = torch.zeros(batch_size, dtype=torch.bool)
    mask[:n] = True
    if n < batch_size:
        xb = torch.cat([xb, xb.new_zeros((batch_size - n,) + tuple(xb.shape[1:]))])
        yb = torch.cat([yb, yb.new_zeros(batch_size - n)])
    return xb, yb, mask


# ----------------------------------------------------------------- image folders


IMAGE_FOLDER_LAYOUT = (
    "expected an ImageFolder tree: DATADIR/train/<class>/<image> for training and, "
    "optionally, DATADIR/val/<class>/<image> with the same class folders for "
    "held-out accuracy (images: .jpg, .jpeg, .png, ...)")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class DataDirError(ValueError):
    """--datadir does not hold a usable data set; the message says why."""


class SeededTransform:
    """An ImageFolder wrapper whose random transform is seeded per sample by
    (seed, epoch, index): the same image gets the same crop after a resume,
    whichever worker loads it."""

    def __init__(self, dataset, transform, seed: int):
        self.dataset, self.transform, self.seed, self.epoch = dataset, transform, seed, 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        import torch
        img, label = self.dataset[i]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 100_003 + self.epoch) * 10_000_019 + int(i))
            return self.transform(img), label


class FolderSource:
    """Training batches from an ImageFolder through a DataLoader, in the
    per-epoch order of epoch_order(); resuming mid-epoch starts the loader at
    the saved step."""

    def __init__(self, dataset: SeededTransform, batch_size: int, seed: int, num_workers: int):
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.num_workers = num_workers
        self.steps_per_epoch = len(dataset) // batch_size
        self.num_samples = len(dataset)

    def batches(self, epoch: int, start: int):
        import torch
        order = epoch_order(len(self.dataset), self.seed, epoch)
        b = self.batch_size
        indices = order[start * b:self.steps_per_epoch * b].tolist()
        self.dataset.epoch = epoch          # workers copy the dataset at iterator start
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=b, sampler=indices,
                                             num_workers=self.num_workers, drop_last=True)
        yield from loader


def load_image_folders(datadir: str, image_size: int, seed: int):
    import torchvision
    from torchvision import transforms as T

    if not os.path.isdir(datadir):
        raise DataDirError(f"--datadir {datadir!r} is not a directory; "
                           f"{IMAGE_FOLDER_LAYOUT}.")
    train_dir, val_dir = os.path.join(datadir, "train"), os.path.join(datadir, "val")
    if not os.path.isdir(train_dir):
        raise DataDirError(f"--datadir {datadir!r} has no train/ directory; "
                           f"{IMAGE_FOLDER_LAYOUT}.")

    def folder(path):
        try:
            return torchvision.datasets.ImageFolder(path)
        except (FileNotFoundError, RuntimeError) as e:
            raise DataDirError(f"--datadir {datadir!r}: {path!r} is not usable ({e}); "
                               f"{IMAGE_FOLDER_LAYOUT}.") from None

    train = folder(train_dir)
    val = folder(val_dir) if os.path.isdir(val_dir) else None
    if val is not None and val.classes != train.classes:
        only_train = sorted(set(train.classes) - set(val.classes))[:5]
        only_val = sorted(set(val.classes) - set(train.classes))[:5]
        raise DataDirError(f"--datadir {datadir!r}: train/ and val/ have different class "
                           f"folders (only in train/: {only_train}, only in val/: "
                           f"{only_val}); {IMAGE_FOLDER_LAYOUT}.")
    norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_tf = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(),
                          T.ToTensor(), norm])
    val_tf = T.Compose([T.Resize(round(image_size / 0.875)), T.CenterCrop(image_size),
                        T.ToTensor(), norm])
    if val is not None:
        val.transform = val_tf
    return SeededTransform(train, train_tf, seed), val, len(train.classes)



# ----------------------------------------------------------------- metrics


class Counters:
    """Compilations, graph executions and device-to-host transfers, from
    torch_xla.debug.metrics (an SPMD run records its executions as
    ExecuteReplicatedTime)."""
    NAMES = {"compilations": ("CompileTime",),
             "executions": ("ExecuteTime", "ExecuteReplicatedTime"),
             "transfers": ("TransferFromDeviceTime",)}

    @classmethod
    def now(cls) -> dict:
        import torch_xla.debug.metrics as met
        out = {}
        for key, names in cls.NAMES.items():
            out[key] = 0
            for name in names:
                data = met.metric_data(name)
                out[key] += 0 if data is None else int(data[0])
        return out

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        return {k: b[k] - a[k] for k in a}

    @staticmethod
    def add(acc: dict, d: dict) -> None:
        for k, v in d.items():
            acc[k] = acc.get(k, 0) + v


# ----------------------------------------------------------------- training


@dataclasses.dataclass
class Task:
    """What a launcher hands to :func:`run`."""
    name: str                               # "mnist" / "imagenet"
    model_name: str
    build_model: Callable[[], object]       # returns an nn.Module (CPU), seeded by run()
    train: object                           # TensorSource / FakeSource / loader source
    evaluate: Optional[Callable[[], Iterator]]  # yields (x, y, mask) CPU batches, or None
    data_description: str
    eval_count: int = 0                     # held-out samples (known on the host)
    compat: dict = dataclasses.field(default_factory=dict)  # must match on resume


def make_optimizer(params, name: str, syncfree: bool, lr: float, momentum: float,
                   weight_decay: float):
    import torch
    import xla_amp
    ns = xla_amp.syncfree if syncfree else torch.optim
    if name == "sgd":
        return ns.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return ns.Adam(params, lr=lr, weight_decay=weight_decay)
    return ns.AdamW(params, lr=lr, weight_decay=weight_decay or 1e-2)


def learning_rate(base: float, step: int, total: int, schedule: str, warmup: int) -> float:
    """The learning rate of global step ``step`` (0-based) of ``total``."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    if schedule == "cosine" and total > warmup:
        frac = min((step - warmup) / (total - warmup), 1.0)
        return base * 0.5 * (1.0 + math.cos(math.pi * frac))
    return base


def _to_cpu(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu() if obj.device.type != "cpu" else obj
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def save_checkpoint(path: str, model, optimizer, scaler, position: dict, compat: dict) -> None:
    import torch
    state = {
        "format": "xla_amp-launcher-checkpoint/1",
        "model": _to_cpu(model.state_dict()),
        "optimizer": _to_cpu(optimizer.state_dict()),
        "scaler": scaler.state_dict(),
        "position": dict(position),
        "compat": dict(compat),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)   # a crash mid-save never leaves a torn checkpoint


def load_checkpoint(path: str, compat: dict) -> dict:
    import torch
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets one message
        raise SystemExit(f"error: --resume {path!r} is not a readable checkpoint ({e})")
    if not isinstance(state, dict) or state.get("format") != "xla_amp-launcher-checkpoint/1":
        raise SystemExit(f"error: --resume {path!r} is not a checkpoint written by these "
                         "launchers (--checkpoint)")
    diffs = [f"--{k}={state['compat'].get(k)!r} there, --{k}={v!r} here"
             for k, v in compat.items() if state["compat"].get(k) != v]
    if diffs:
        raise SystemExit(f"error: --resume {path!r} was written by a different "
                         f"configuration: {'; '.join(diffs)}")
    return state


class _Progress:
    """A tqdm bar per epoch, or nothing with --noprogress."""

    def __init__(self, enabled: bool, total: int, initial: int, desc: str):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step",
                            dynamic_ncols=True, leave=False, file=sys.stderr,
                            mininterval=0.25)

    def update(self, n=1):
        if self.bar:
            self.bar.update(n)

    def postfix(self, text: str):
        if self.bar:
            self.bar.set_postfix_str(text, refresh=False)

    def close(self):
        if self.bar:
            self.bar.close()


def _fmt_scale(s: float) -> str:
    return f"{s:.0f}" if s >= 1 and s == int(s) and s < 1e7 else f"{s:.3g}"


def _fmt_rate(r: float) -> str:
    return f"{r:,.0f}" if r >= 10 else f"{r:.2f}"


def run(task: Task, devices: Devices) -> int:
    """Train ``task`` per the flags; print the summary; return the exit status."""
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.core.xla_model as xm
    import xla_amp

    t_start = time.perf_counter()
    dev = devices.device
    dtype = getattr(torch, DTYPES[FLAGS.dtype]) if FLAGS.dtype else None
    compat = dict(task.compat, launcher=task.name, model=task.model_name,
                  optimizer=FLAGS.optimizer, syncfree=FLAGS.syncfree,
                  batch_size=FLAGS.batch_size, amp=FLAGS.amp, seed=FLAGS.seed,
                  fake_data=FLAGS.fake_data)

    torch.manual_seed(FLAGS.seed)
    model = task.build_model().to(dev)
    optimizer = make_optimizer(model.parameters(), FLAGS.optimizer, FLAGS.syncfree,
                               FLAGS.lr, FLAGS.momentum, FLAGS.weight_decay)
    scaler = xla_amp.GradScaler(enabled=FLAGS.amp)
    autocast_kw = dict(enabled=FLAGS.amp, dtype=dtype, policy=FLAGS.policy)
    with xla_amp.autocast(dev, **autocast_kw) as ac:      # what will autocast do?
        amp_dtype = torch.get_autocast_dtype("xla")
        amp_on = torch.is_autocast_enabled("xla")
        policy_name = getattr(getattr(ac, "policy", None), "name", None) or FLAGS.policy
    position = {"epoch": 0, "step": 0, "global_step": 0}
    if FLAGS.resume:
        state = load_checkpoint(FLAGS.resume, compat)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if FLAGS.amp:
            scaler.load_state_dict(state["scaler"])
        position = dict(state["position"])
        print(f"resumed from {FLAGS.resume}: epoch {position['epoch'] + 1}, "
              f"step {position['step']}, {position['global_step']} steps done", flush=True)

    writer = None
    if FLAGS.logdir:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(FLAGS.logdir)

    nparams = sum(p.numel() for p in model.parameters())
    steps_per_epoch = task.train.steps_per_epoch
    if FLAGS.amp:
        precision = (f"AMP {str(amp_dtype).replace('torch.', '')} (policy "
                     f"{policy_name or 'device default'}) + GradScaler"
                     if amp_on else "AMP requested but autocast is disabled for this "
                     "dtype/policy (see warning); fp32 + GradScaler")
    else:
        precision = "fp32"
    opt_desc = (f"{'xla_amp.syncfree' if FLAGS.syncfree else 'torch.optim'}."
                f"{type(optimizer).__name__}(lr={FLAGS.lr:g}"
                + (f", momentum={FLAGS.momentum:g}" if FLAGS.optimizer == "sgd" else "")
                + f"), {FLAGS.lr_schedule} lr"
                + (f" after {FLAGS.warmup_steps} warm-up steps" if FLAGS.warmup_steps else ""))
    par = (f"{devices.count} x {devices.hw} (SPMD data parallel)" if devices.count > 1
           else f"1 x {devices.hw}")
    print(f"data       {task.data_description}\n"
          f"model      {task.model_name}, {nparams:,} parameters\n"
          f"precision  {precision}\n"
          f"optimizer  {opt_desc}, batch {FLAGS.batch_size}, {steps_per_epoch} steps/epoch, "
          f"{FLAGS.num_epochs} epochs\n"
          f"devices    {par}", flush=True)

    # Device-side running sums for the progress bar: [loss*n, correct, n].
    state_box = {"totals": torch.zeros(3).to(dev), "monitor": None}

    total_steps = steps_per_epoch * FLAGS.num_epochs

    def train_step(x, y, step):
        lr = learning_rate(FLAGS.lr, step, total_steps, FLAGS.lr_schedule, FLAGS.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr                  # a graph input, not a constant: no recompile
        optimizer.zero_grad(set_to_none=True)
        with xla_amp.autocast(dev, **autocast_kw):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        with torch.no_grad():
            n = torch.full((), float(y.shape[0]), device=dev)
            correct = (logits.argmax(dim=1) == y).sum().float()
            totals = state_box["totals"] + torch.stack([loss.detach().float() * n, correct, n])
            scale = scaler.get_scale_tensor() if FLAGS.amp else None
            if scale is None:
                scale = torch.ones((), device=dev)
            state_box["totals"] = totals
            # one tensor, so that a progress read is a single transfer
            state_box["monitor"] = torch.cat([totals, scale.reshape(1).float()])
        torch_xla.sync()

    def evaluate() -> Optional[float]:
        if task.evaluate is None:
            return None
        model.eval()
        correct = torch.zeros((), dtype=torch.long).to(dev)
        with torch.no_grad():
            for xb, yb, mask in task.evaluate():
                xb, yb, mask = (devices.shard(t.to(dev)) for t in (xb, yb, mask))
                with xla_amp.autocast(dev, **autocast_kw):
                    pred = model(xb).argmax(dim=1)
                correct = correct + ((pred == yb) & mask).sum()
                torch_xla.sync()
        model.train()
        return 100.0 * int(correct.cpu()) / max(task.eval_count, 1)   # one read

    def checkpoint(pos):
        if FLAGS.checkpoint:
            save_checkpoint(FLAGS.checkpoint, model, optimizer, scaler, pos, compat)

    train_counts: dict = {}
    steps_run = samples_run = 0
    train_seconds = 0.0
    windows = []                       # (samples, seconds) between progress reads
    last = {"loss": float("nan"), "acc": float("nan"), "scale": float("nan"),
            "rate": float("nan")}
    eval_acc = None
    global_step = position["global_step"]
    stop = FLAGS.max_steps and global_step >= FLAGS.max_steps
    model.train()
    for epoch in range(position["epoch"], FLAGS.num_epochs):
        if stop:
            break
        start = position["step"] if epoch == position["epoch"] else 0
        state_box["totals"] = torch.zeros(3).to(dev)   # host->device copy: no graph
        bar = _Progress(FLAGS.progress, steps_per_epoch, start,
                        f"epoch {epoch + 1}/{FLAGS.num_epochs}")
        xm.wait_device_ops()           # evaluation's executions are counted by now
        c0 = Counters.now()
        t0 = win_t = time.perf_counter()
        win_samples = 0
        paused = 0.0                   # time spent checkpointing inside the epoch
        step = start - 1
        for step, (x, y) in enumerate(task.train.batches(epoch, start), start=start):
            if x.device.type == "cpu":
                x, y = devices.shard(x.to(dev)), devices.shard(y.to(dev))
            train_step(x, y, global_step)
            global_step += 1
            steps_run += 1
            samples_run += FLAGS.batch_size
            win_samples += FLAGS.batch_size
            bar.update(1)
            stop = bool(FLAGS.max_steps) and global_step >= FLAGS.max_steps
            end_of_epoch = step + 1 == steps_per_epoch
            if global_step % FLAGS.log_steps == 0 or end_of_epoch or stop:
                loss_sum, correct, n, scale = state_box["monitor"].cpu().tolist()
                now = time.perf_counter()
                windows.append((win_samples, now - win_t))
                last.update(loss=loss_sum / max(n, 1), acc=100.0 * correct / max(n, 1),
                            scale=scale, rate=win_samples / max(now - win_t, 1e-9))
                win_t, win_samples = now, 0
                bar.postfix(f"loss={last['loss']:.4f} acc={last['acc']:.1f}% "
                            f"{_fmt_rate(last['rate'])} samples/s"
                            + (f" scale={_fmt_scale(scale)}" if FLAGS.amp else ""))
                if writer:
                    writer.add_scalar("train/lr", optimizer.param_groups[0]["lr"], global_step)
                    writer.add_scalar("train/loss", last["loss"], global_step)
                    writer.add_scalar("train/accuracy", last["acc"], global_step)
                    writer.add_scalar("train/samples_per_sec", last["rate"], global_step)
                    if FLAGS.amp:
                        writer.add_scalar("train/loss_scale", scale, global_step)
            if (FLAGS.checkpoint and FLAGS.checkpoint_steps
                    and global_step % FLAGS.checkpoint_steps == 0
                    and not end_of_epoch and not stop):
                t_ck = time.perf_counter()
                xm.wait_device_ops()
                Counters.add(train_counts, Counters.delta(c0, Counters.now()))
                checkpoint({"epoch": epoch, "step": step + 1, "global_step": global_step})
                paused += time.perf_counter() - t_ck
                win_t += time.perf_counter() - t_ck
                c0 = Counters.now()
            if stop:
                break
        train_seconds += time.perf_counter() - t0 - paused
        xm.wait_device_ops()           # so that every execution has been counted
        Counters.add(train_counts, Counters.delta(c0, Counters.now()))
        bar.close()
        if step + 1 == steps_per_epoch:
            pos = {"epoch": epoch + 1, "step": 0, "global_step": global_step}
        else:
            pos = {"epoch": epoch, "step": step + 1, "global_step": global_step}
        eval_acc = evaluate()
        line = (f"epoch {epoch + 1}/{FLAGS.num_epochs}"
                + (f" (stopped at step {step + 1}/{steps_per_epoch})"
                   if pos["step"] else "")
                + f": train loss {last['loss']:.4f}, train acc {last['acc']:.2f}%")
        if eval_acc is not None:
            line += f", held-out acc {eval_acc:.2f}%"
        if FLAGS.amp:
            line += f", loss scale {_fmt_scale(last['scale'])}"
        print(line, flush=True)
        if writer and eval_acc is not None:
            writer.add_scalar("eval/accuracy", eval_acc, global_step)
        checkpoint(pos)
    if steps_run == 0 and eval_acc is None:
        eval_acc = evaluate()          # e.g. resumed from a finished run
    if writer:
        writer.flush()
        writer.close()

    # ------------------------------------------------------------ summary
    wall = time.perf_counter() - t_start
    ok = True
    print("\n" + "=" * 28 + " summary " + "=" * 28)
    if eval_acc is not None:
        acc_line = f"{eval_acc:.2f}% held-out ({task.eval_count} images)"
        if FLAGS.target_accuracy is not None:
            ok = eval_acc >= FLAGS.target_accuracy
            acc_line += (f"; target {FLAGS.target_accuracy:.2f}%: "
                         + ("met" if ok else "MISSED"))
        print(f"accuracy      {acc_line}")
    else:
        why = ("fake data" if task.evaluate is None and "fake" in str(task.compat.get("data"))
               else "no held-out data" if task.evaluate is None else "nothing trained")
        print(f"accuracy      n/a ({why})")
        if FLAGS.target_accuracy is not None:
            ok = False
    if steps_run:
        line = (f"{_fmt_rate(samples_run / max(train_seconds, 1e-9))} samples/s overall "
                f"({steps_run} steps, {samples_run:,} samples in {train_seconds:.1f} s)")
        later = windows[1:]            # the first window paid for compilation
        if later and sum(t for _, t in later) > 0:
            line += (f"; {_fmt_rate(sum(s for s, _ in later) / sum(t for _, t in later))} "
                     "samples/s after the first progress window")
        print(f"throughput    {line}")
        c = train_counts
        print(f"XLA           {c.get('compilations', 0)} compilations, "
              f"{c.get('executions', 0) / steps_run:.2f} graph executions/step, "
              f"{c.get('transfers', 0) / steps_run:.2f} host syncs/step "
              f"(device-to-host transfers; training steps only)")
    if FLAGS.amp:
        print(f"loss scale    {_fmt_scale(last['scale'])}")
    if FLAGS.checkpoint:
        print(f"checkpoint    {FLAGS.checkpoint} (after global step {global_step})")
    print(f"wall time     {wall:.1f} s (this machine's load included)")
    print("=" * 65, flush=True)
    if not ok:
        print(f"FAILED: held-out accuracy {eval_acc:.2f}% is below --target_accuracy "
              f"{FLAGS.target_accuracy:.2f}%", file=sys.stderr, flush=True)
        return 1
    return 0
