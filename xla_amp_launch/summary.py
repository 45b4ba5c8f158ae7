"""The launchers' final summary: accuracy against the target, throughput, and
what the training steps cost in XLA compilations, executions and transfers."""
from __future__ import annotations

import sys
import time

from xla_amp_launch.metrics import fmt_rate, fmt_scale


def summary(run, flags) -> int:
    """Print the summary of `run` (a loop.Run); the exit status: 1 when the
    held-out accuracy misses ``--target_accuracy`` (or there is none)."""
    wall = time.perf_counter() - run.t_start
    task, ok = run.task, True
    print("\n" + "=" * 28 + " summary " + "=" * 28)
    if run.eval_acc is not None:
        acc_line = f"{run.eval_acc:.2f}% held-out ({task.eval_count} images)"
        if flags.target_accuracy is not None:
            ok = run.eval_acc >= flags.target_accuracy
            acc_line += (f"; target {flags.target_accuracy:.2f}%: "
                         + ("met" if ok else "MISSED"))
        print(f"accuracy      {acc_line}")
    else:
        why = ("fake data" if task.evaluate is None and "fake" in str(task.compat.get("data"))
               else "no held-out data" if task.evaluate is None else "nothing trained")
        print(f"accuracy      n/a ({why})")
        if flags.target_accuracy is not None:
            ok = False
    if run.steps_run:
        line = (f"{fmt_rate(run.samples_run / max(run.train_seconds, 1e-9))} samples/s "
                f"overall ({run.steps_run} steps, {run.samples_run:,} samples in "
                f"{run.train_seconds:.1f} s)")
        later = run.windows[1:]        # the first window paid for compilation
        if later and sum(t for _, t in later) > 0:
            line += (f"; {fmt_rate(sum(s for s, _ in later) / sum(t for _, t in later))} "
                     "samples/s after the first progress window")
        print(f"throughput    {line}")
        c = run.counts
        n = c.get("compilations", 0)
        print(f"XLA           {n} compilation{'' if n == 1 else 's'}, "
              f"{c.get('executions', 0) / run.steps_run:.2f} graph executions/step, "
              f"{c.get('transfers', 0) / run.steps_run:.2f} host syncs/step "
              f"(device-to-host transfers; training steps only)")
    if flags.amp:
        print(f"loss scale    {fmt_scale(run.last['scale'])}")
    if flags.checkpoint:
        print(f"checkpoint    {flags.checkpoint} (after global step {run.global_step})")
    print(f"wall time     {wall:.1f} s (other load on the machine included)")
    print("=" * 65, flush=True)
    if not ok:
        acc = "none" if run.eval_acc is None else f"{run.eval_acc:.2f}%"
        print(f"FAILED: held-out accuracy {acc} is below --target_accuracy "
              f"{flags.target_accuracy:.2f}%", file=sys.stderr, flush=True)
        return 1
    return 0
