"""--precision_report: what the launchers write about precision.

    before the first step:  the precision report of one forward pass on the
                            first batch, under the run's autocast settings and
                            module policies (traced only: nothing executes, the
                            model's buffers are left as they were)
    at each progress read:  the scaler's skip counter comes with the other
                            figures (same transfer); when it rose, the names of
                            the parameters whose gradients were inf/NaN in the
                            latest skipped step (one more read, only then)

Written to --logdir as markdown and JSON (and TensorBoard text), or printed.
"""
from __future__ import annotations

import os

from xla_amp_launch.flags import FLAGS


def _emit(run, name: str, markdown: str, json_text: str, step: int) -> str:
    if not FLAGS.logdir:
        print(markdown, flush=True)
        return "printed above"
    os.makedirs(FLAGS.logdir, exist_ok=True)
    base = os.path.join(FLAGS.logdir, name)
    with open(base + ".md", "w") as f:
        f.write(markdown + "\n")
    with open(base + ".json", "w") as f:
        f.write(json_text + "\n")
    if run.writer:
        run.writer.add_text(name, markdown, step)
    return f"{base}.md, {base}.json"


def precision_report(run, x) -> None:
    """The report of one forward pass on batch `x` (before training starts)."""
    import xla_amp
    from xla_amp.numerics._explain import record_call
    region = xla_amp.autocast(run.devices.device, record=True, **run.autocast_kw)
    report = record_call(region, run.model, x)  # traced and dropped: no execution
    header = (f"precision report of {run.task.model_name} (policy {report.policy}, "
              f"{report.dtype or 'autocast off'}), one forward pass\n\n")
    where = _emit(run, "precision_report", header + report.table(),
                  report.to_json(indent=1), run.global_step)
    print(f"precision  report: {len(report.rows)} rows ({where})", flush=True)


def overflow_report(run, skipped: int) -> None:
    """After a progress read: name the gradients of the latest skipped step if
    the skip counter rose since the last read."""
    import json
    seen = run.skipped_seen
    if skipped <= seen:
        return
    run.skipped_seen = skipped
    names = run.scaler.overflow_report(run.optimizer, last_skipped=True)
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    markdown = (f"{skipped - seen} step(s) skipped before global step {run.global_step}; "
                f"the latest had inf/NaN gradients in: {shown or 'none recorded'}")
    where = _emit(run, "overflow_report", markdown,
                  json.dumps({"global_step": run.global_step, "skipped_total": skipped,
                              "parameters": names}), run.global_step)
    print(f"overflow   {markdown} ({where})", flush=True)
