"""The training loop the launchers exist to show, in four parts::

    run = setup(task, devices)        # model, optimizer, scaler, resume, header
    for epoch ...: train_epoch(run, epoch); evaluate(run)
    return summary(run)               # exit status: 1 if --target_accuracy missed

One training step::

    with xla_amp.autocast(device):             # bf16 (or fp16) where the policy says
        loss = F.cross_entropy(model(x), y)    # (--compile: these two lines compiled)
    scaler.scale(loss).backward()              # xla_amp.GradScaler
    scaler.step(optimizer)                     # xla_amp.syncfree.SGD/Adam/AdamW: no host sync
    scaler.update()
    torch_xla.sync()                           # one graph execution per step

Loss, accuracy and the loss scale are summed on the device inside that same
graph and read back once per ``--log_steps`` steps (one transfer).
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Callable, Iterator, Optional

from xla_amp_launch import precision as precision_mod, reports
from xla_amp_launch.checkpoint import Checkpoints
from xla_amp_launch.devices import Devices
from xla_amp_launch.header import autocast_dtype, print_header
from xla_amp_launch.flags import (DTYPES, FLAGS, apply_test_run_flags, print_metrics_report,
                                  resolve_precision)
from xla_amp_launch.metrics import Counters, Progress, fmt_rate, fmt_scale
from xla_amp_launch.summary import summary


@dataclasses.dataclass
class Task:
    """What a launcher hands to :func:`train`."""
    name: str                               # "mnist" / "imagenet"
    model_name: str
    build_model: Callable[[], object]       # returns an nn.Module (CPU), seeded by setup()
    train: object                           # TensorSource / FakeSource / loader source
    evaluate: Optional[Callable[[], Iterator]]  # yields (x, y, mask) CPU batches, or None
    data_description: str
    eval_count: int = 0                     # held-out samples (known on the host)
    compat: dict = dataclasses.field(default_factory=dict)  # must match on resume


@dataclasses.dataclass
class Run:
    """A training run's objects and running figures."""
    task: Task
    devices: Devices
    model: object
    optimizer: object
    scaler: object
    autocast_kw: dict
    forward_loss: Callable                  # (x, y) -> (logits, loss), maybe compiled
    compat: dict
    position: dict
    total_steps: int
    writer: object = None
    t_start: float = 0.0
    totals: object = None                   # device [loss*n, correct, n] of the epoch
    monitor: object = None                  # device totals + scale: one read
    counts: dict = dataclasses.field(default_factory=dict)
    steps_run: int = 0
    samples_run: int = 0
    train_seconds: float = 0.0
    windows: list = dataclasses.field(default_factory=list)  # (samples, s) between reads
    last: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
        ("loss", "acc", "scale", "rate"), float("nan")))
    eval_acc: Optional[float] = None
    global_step: int = 0
    stop: bool = False
    skipped_seen: int = 0                   # --precision_report: skips already reported
    ck: Optional[Checkpoints] = None        # --checkpoint (locked) / --resume
    amp_dtype: object = None                # autocast's dtype, None without autocast
    guard: object = None                    # xla_amp.checkpoint.PreemptionGuard
    preempted: bool = False                 # stopped by SIGTERM/SIGINT at a step boundary


def make_optimizer(params, name: str, syncfree: bool, lr: float, momentum: float,
                   weight_decay: float, **low_precision):
    """``low_precision``: master_weights / stochastic_rounding (syncfree only)."""
    import torch
    import xla_amp
    ns = xla_amp.syncfree if syncfree else torch.optim
    if name == "sgd":
        return ns.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                      **low_precision)
    # torch.optim's Adam family: the step count on the device (capturable), so
    # the GradScaler's masked step needs no host sync (docs/sync_free.md)
    extra = {} if syncfree else {"capturable": True}
    if name == "adam":
        return ns.Adam(params, lr=lr, weight_decay=weight_decay, **low_precision, **extra)
    return ns.AdamW(params, lr=lr, weight_decay=weight_decay or 1e-2, **low_precision, **extra)


def make_forward_loss(model, device, autocast_kw: dict, compile: bool) -> Callable:
    """``(x, y) -> (logits, loss)`` under autocast; compiled with --compile."""
    import torch
    import torch.nn.functional as F
    import xla_amp

    def forward_loss(x, y):
        with xla_amp.autocast(device, **autocast_kw):
            logits = model(x)
            return logits, F.cross_entropy(logits, y)
    return torch.compile(forward_loss, backend="openxla") if compile else forward_loss


def learning_rate(base: float, step: int, total: int, schedule: str, warmup: int) -> float:
    """The learning rate of global step ``step`` (0-based) of ``total``."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    if schedule == "cosine" and total > warmup:
        frac = min((step - warmup) / (total - warmup), 1.0)
        return base * 0.5 * (1.0 + math.cos(math.pi * frac))
    return base


def train(task: Task, devices: Devices) -> int:
    """Train ``task`` per the flags (--num_steps / --drop_last applied here);
    print the summary; return the exit status (xla_amp_launch/checkpoint.py:
    73, 74, 75 for the checkpoint's lock, an OS failure writing it, a stop
    by SIGTERM/SIGINT)."""
    from xla_amp import checkpoint as c
    ck = Checkpoints.from_flags(FLAGS)      # a live run on --checkpoint: exit 73
    try:
        with c.preemption_guard() as guard:  # SIGTERM/SIGINT: save at the step's end
            run = setup(apply_test_run_flags(task), devices, ck)
            run.guard = guard
            for epoch in range(run.position["epoch"], FLAGS.num_epochs):
                if run.stop:
                    break
                train_epoch(run, epoch)
    except c.CheckpointError as e:          # disk full, read-only, quota ...: one line
        kept = "the previous checkpoint is intact" if os.path.exists(ck.path) \
            else "no checkpoint was written before"
        print(f"error: {e}; {kept}", file=sys.stderr, flush=True)
        return c.EXIT_CHECKPOINT_IO
    finally:
        ck.release()
    if run.preempted:
        return _stopped_by_signal(run)
    if run.steps_run == 0 and run.eval_acc is None:
        run.eval_acc = evaluate(run)  # e.g. resumed from a finished run
    if run.writer:
        run.writer.flush()
        run.writer.close()
    return summary(run, FLAGS)


def _stopped_by_signal(run: Run) -> int:
    from xla_amp import checkpoint as c
    sig, path = run.guard.signal_name, run.ck.path
    if path:
        print(f"stopped by {sig} after step {run.global_step}: checkpoint written to {path}; "
              f"resume with --auto_resume (exit status {c.EXIT_PREEMPTED})", flush=True)
        return c.EXIT_PREEMPTED
    print(f"stopped by {sig} after step {run.global_step}; nothing saved (no --checkpoint)",
          flush=True)
    return 128 + run.guard.signum


def setup(task: Task, devices: Devices, ck: Checkpoints) -> Run:
    """Build model, optimizer and scaler, resume if asked, print the header."""
    import torch
    import xla_amp

    t_start = time.perf_counter()
    precision = resolve_precision()
    dev = devices.device
    dtype = getattr(torch, DTYPES[FLAGS.dtype]) if FLAGS.dtype else None
    compat = dict(task.compat, launcher=task.name, model=task.model_name,
                  optimizer=FLAGS.optimizer, syncfree=FLAGS.syncfree,
                  batch_size=FLAGS.batch_size, amp=FLAGS.amp, seed=FLAGS.seed,
                  fake_data=FLAGS.fake_data)
    torch.manual_seed(FLAGS.seed)
    model = task.build_model().to(dev)
    compat["precision"] = precision
    precision_mod.prepare(model, precision, FLAGS.module_policy)
    if FLAGS.fp8:
        compat["fp8"] = FLAGS.fp8_scaling
        converted, kept = precision_mod.prepare_fp8(model, FLAGS.fp8_scaling)
        print(f"fp8 ({FLAGS.fp8_scaling} scaling): {len(converted)} Linear layers converted"
              + (f"; kept in high precision (dimensions not multiples of 16): "
                 f"{', '.join(kept)}" if kept else ""), flush=True)
    if FLAGS.fsdp:
        compat["fsdp"] = True
        model = precision_mod.shard(model, precision, devices.mesh)
    optimizer = make_optimizer(model.named_parameters(), FLAGS.optimizer, FLAGS.syncfree,
                               FLAGS.lr, FLAGS.momentum, FLAGS.weight_decay,
                               **precision_mod.optimizer_options(precision))
    if FLAGS.fp8 and FLAGS.fp8_scaling == "delayed":
        from xla_amp import fp8
        fp8.attach(optimizer, model)  # the histories roll after each (unskipped) step
    scaler = xla_amp.GradScaler(enabled=FLAGS.amp)
    autocast_kw = dict(enabled=FLAGS.amp, dtype=dtype, policy=FLAGS.policy)
    amp_dtype = autocast_dtype(dev, autocast_kw)
    position = {"epoch": 0, "step": 0, "global_step": 0}
    state = ck.resume_state(compat)         # --resume / --auto_resume: data only
    if state is not None and state.get("compat", {}).get("fp8") != compat.get("fp8"):
        from xla_amp_launch.checkpoint import EXIT_BAD_RESUME, fail
        fp8_of = lambda c: f"--fp8 --fp8_scaling {c['fp8']}" if c.get("fp8") else "no --fp8"  # noqa: E731
        fail(EXIT_BAD_RESUME, f"--resume file {ck.resume} was written with "
                              f"{fp8_of(state.get('compat', {}))}, this run has {fp8_of(compat)}")
    if state is not None:
        notes = ck.restore(state, dict(model=model, optimizer=optimizer, scaler=scaler,
                                       amp_dtype=amp_dtype))
        position = dict(state["position"])
        print(f"resumed from {ck.resume}: epoch {position['epoch'] + 1}, "
              f"step {position['step']}, {position['global_step']} steps done", flush=True)
        if notes:
            print(f"converted to --precision {precision}: {'; '.join(notes)}", flush=True)
    writer = None
    if FLAGS.logdir:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(FLAGS.logdir)
    forward_loss = make_forward_loss(model, dev, autocast_kw, FLAGS.compile)
    run = Run(task, devices, model, optimizer, scaler, autocast_kw, forward_loss, compat, position,
              task.train.steps_per_epoch * FLAGS.num_epochs, writer, t_start,
              global_step=position["global_step"], ck=ck, amp_dtype=amp_dtype)
    run.stop = bool(FLAGS.max_steps) and run.global_step >= FLAGS.max_steps
    print_header(run)
    model.train()
    return run


def train_step(run: Run, x, y) -> None:
    """One step: one graph execution (--compile: four), no transfer."""
    import torch
    import torch_xla
    dev = run.devices.device
    lr = learning_rate(FLAGS.lr, run.global_step, run.total_steps, FLAGS.lr_schedule,
                       FLAGS.warmup_steps)
    for group in run.optimizer.param_groups:
        group["lr"] = lr                  # a graph input, not a constant: no recompile
    run.optimizer.zero_grad(set_to_none=True)
    logits, loss = run.forward_loss(x, y)
    run.scaler.scale(loss).backward()
    run.scaler.step(run.optimizer)
    run.scaler.update()
    with torch.no_grad():
        n = torch.full((), float(y.shape[0]), device=dev)
        correct = (logits.argmax(dim=1) == y).sum().float()
        run.totals = run.totals + torch.stack([loss.detach().float() * n, correct, n])
        scale = run.scaler.get_scale_tensor() if FLAGS.amp else None
        if scale is None:
            scale = torch.ones((), device=dev)
        # one tensor, so that a progress read is a single transfer
        extra = [scale.reshape(1).float()]
        if FLAGS.precision_report and FLAGS.amp:  # the skip counter rides along
            extra.append(run.scaler.skipped_steps_tensor().reshape(1).float())
        run.monitor = torch.cat([run.totals, *extra])
    torch_xla.sync()


def _log_progress(run: Run, bar: Progress, win_samples: int, win_t: float) -> float:
    """Read the device sums (the one transfer); returns the read's time."""
    loss_sum, correct, n, scale, *skipped = run.monitor.cpu().tolist()
    if skipped:
        reports.overflow_report(run, int(skipped[0]))
    now = time.perf_counter()
    run.windows.append((win_samples, now - win_t))
    run.last.update(loss=loss_sum / max(n, 1), acc=100.0 * correct / max(n, 1),
                    scale=scale, rate=win_samples / max(now - win_t, 1e-9))
    last = run.last
    bar.postfix(f"loss={last['loss']:.4f} acc={last['acc']:.1f}% "
                f"{fmt_rate(last['rate'])} samples/s"
                + (f" scale={fmt_scale(scale)}" if FLAGS.amp else ""))
    if run.writer:
        w, step = run.writer, run.global_step
        w.add_scalar("train/lr", run.optimizer.param_groups[0]["lr"], step)
        w.add_scalar("train/loss", last["loss"], step)
        w.add_scalar("train/accuracy", last["acc"], step)
        w.add_scalar("train/samples_per_sec", last["rate"], step)
        if FLAGS.amp:
            w.add_scalar("train/loss_scale", scale, step)
    return now


def train_epoch(run: Run, epoch: int) -> None:
    """Train one epoch (from the saved step if resuming into it), evaluate,
    print the epoch line, checkpoint."""
    import torch
    import torch_xla.core.xla_model as xm
    dev, spe = run.devices.device, run.task.train.steps_per_epoch
    start = run.position["step"] if epoch == run.position["epoch"] else 0
    run.totals = torch.zeros(3).to(dev)   # host->device copy: no graph
    bar = Progress(FLAGS.progress, spe, start, f"epoch {epoch + 1}/{FLAGS.num_epochs}")
    xm.wait_device_ops()                  # evaluation's executions are counted by now
    c0 = Counters.now()
    t0 = win_t = time.perf_counter()
    win_samples = 0
    paused = 0.0                          # time spent checkpointing inside the epoch
    step = start - 1
    for step, (x, y) in enumerate(run.task.train.batches(epoch, start), start=start):
        if x.device.type == "cpu":
            x, y = run.devices.put(x), run.devices.put(y)
        if FLAGS.precision_report and run.steps_run == 0:
            reports.precision_report(run, x)
        train_step(run, x, y)
        run.global_step += 1
        run.steps_run += 1
        run.samples_run += FLAGS.batch_size
        win_samples += FLAGS.batch_size
        bar.update(1)
        run.stop = bool(FLAGS.max_steps) and run.global_step >= FLAGS.max_steps
        if run.guard is not None and run.guard.requested:  # the step in flight is done
            run.stop = run.preempted = True
        end_of_epoch = step + 1 == spe
        if run.global_step % FLAGS.log_steps == 0 or end_of_epoch or run.stop:
            win_t, win_samples = _log_progress(run, bar, win_samples, win_t), 0
        if (FLAGS.checkpoint and FLAGS.checkpoint_steps
                and run.global_step % FLAGS.checkpoint_steps == 0
                and not end_of_epoch and not run.stop):
            t_ck = time.perf_counter()
            xm.wait_device_ops()
            Counters.add(run.counts, Counters.delta(c0, Counters.now()))
            run.ck.save(run, {"epoch": epoch, "step": step + 1, "global_step": run.global_step})
            paused += time.perf_counter() - t_ck
            win_t += time.perf_counter() - t_ck
            c0 = Counters.now()
        if run.stop:
            break
    run.train_seconds += time.perf_counter() - t0 - paused
    xm.wait_device_ops()                  # so that every execution has been counted
    Counters.add(run.counts, Counters.delta(c0, Counters.now()))
    bar.close()
    if step + 1 == spe:
        pos = {"epoch": epoch + 1, "step": 0, "global_step": run.global_step}
    else:
        pos = {"epoch": epoch, "step": step + 1, "global_step": run.global_step}
    if run.preempted:                     # save now; no evaluation in the grace period
        run.ck.save(run, pos)
        return
    run.eval_acc = evaluate(run)
    line = (f"epoch {epoch + 1}/{FLAGS.num_epochs}"
            + (f" (stopped at step {step + 1}/{spe})" if pos["step"] else "")
            + f": train loss {run.last['loss']:.4f}, train acc {run.last['acc']:.2f}%")
    if run.eval_acc is not None:
        line += f", held-out acc {run.eval_acc:.2f}%"
    if FLAGS.amp:
        line += f", loss scale {fmt_scale(run.last['scale'])}"
    print(line, flush=True)
    print_metrics_report()  # --metrics_debug: after each epoch, as PyTorch/XLA's launchers
    if run.writer and run.eval_acc is not None:
        run.writer.add_scalar("eval/accuracy", run.eval_acc, run.global_step)
    run.ck.save(run, pos)


def evaluate(run: Run) -> Optional[float]:
    """Held-out accuracy in percent (one read at the end), or None."""
    import torch
    import torch_xla
    import xla_amp
    if run.task.evaluate is None:
        return None
    dev = run.devices.device
    run.model.eval()
    correct = torch.zeros((), dtype=torch.long).to(dev)
    with torch.no_grad():
        for xb, yb, mask in run.task.evaluate():
            xb, yb, mask = (run.devices.put(t) for t in (xb, yb, mask))
            with xla_amp.autocast(dev, **run.autocast_kw):
                pred = run.model(xb).argmax(dim=1)
            correct = correct + ((pred == yb) & mask).sum()
            torch_xla.sync()
    run.model.train()
    return 100.0 * int(correct.cpu()) / max(run.task.eval_count, 1)
