"""The launchers' header: what will run (data, model, precision, optimizer,
devices), printed once before training."""
from __future__ import annotations

from xla_amp_launch.flags import FLAGS


def autocast_dtype(device, autocast_kw: dict):
    """The dtype the autocast region computes in, None if it is disabled."""
    import torch
    import xla_amp
    with xla_amp.autocast(device, **autocast_kw):
        return torch.get_autocast_dtype("xla") if torch.is_autocast_enabled("xla") else None


def print_header(run) -> None:
    import torch
    import xla_amp
    with xla_amp.autocast(run.devices.device, **run.autocast_kw) as ac:  # what will it do?
        amp_dtype = torch.get_autocast_dtype("xla")
        amp_on = torch.is_autocast_enabled("xla")
        policy_name = getattr(getattr(ac, "policy", None), "name", None) or FLAGS.policy
    if FLAGS.amp:
        precision = (f"AMP {str(amp_dtype).replace('torch.', '')} (policy "
                     f"{policy_name or 'device default'}) + GradScaler"
                     if amp_on else "AMP requested but autocast is disabled for this "
                     "dtype/policy (see warning); fp32 + GradScaler")
    else:
        precision = "fp32"
    precision += {"bf16": "; bf16 weights, plain update",
                  "bf16_master": "; bf16 weights, fp32 master copy in the optimizer",
                  "bf16_sr": "; bf16 weights, stochastically rounded updates"}.get(
                      run.compat["precision"], "")
    if FLAGS.module_policy:
        precision += f"; module policies {FLAGS.module_policy}"
    if FLAGS.compile:
        precision += "; forward + loss compiled (torch.compile, openxla)"
    opt_desc = (f"{'xla_amp.syncfree' if FLAGS.syncfree else 'torch.optim'}."
                f"{type(run.optimizer).__name__}(lr={FLAGS.lr:g}"
                + (f", momentum={FLAGS.momentum:g}" if FLAGS.optimizer == "sgd" else "")
                + f"), {FLAGS.lr_schedule} lr"
                + (f" after {FLAGS.warmup_steps} warm-up steps" if FLAGS.warmup_steps else ""))
    d = run.devices
    mode = "FSDPv2: parameters, gradients and state sharded" if FLAGS.fsdp \
        else "SPMD data parallel"
    par = f"{d.count} x {d.hw} ({mode})" if d.count > 1 else f"1 x {d.hw}"
    nparams = sum(p.numel() for p in run.model.parameters())
    print(f"data       {run.task.data_description}\n"
          f"model      {run.task.model_name}, {nparams:,} parameters\n"
          f"precision  {precision}\n"
          f"optimizer  {opt_desc}, batch {FLAGS.batch_size}, "
          f"{run.task.train.steps_per_epoch} steps/epoch, {FLAGS.num_epochs} epochs\n"
          f"devices    {par}", flush=True)
