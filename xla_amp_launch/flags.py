"""The launchers' common command-line flags (absl), with per-launcher defaults."""
from __future__ import annotations

import importlib.util
import os
import runpy
from typing import Optional

from absl import flags

FLAGS = flags.FLAGS

from xla_amp_launch.precision import PRECISIONS, module_policy_entries, optimizer_options

OPTIMIZERS = ("sgd", "adam", "adamw")
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


def define_flags(*, batch_size: int, num_epochs: int, lr: float, optimizer: str = "sgd",
                 momentum: float = 0.9, weight_decay: float = 0.0, log_steps: int = 10,
                 fake_data: bool = False, eval_batch_size: Optional[int] = None,
                 lr_schedule: str = "constant", num_workers: int = 2) -> None:
    """Define the launchers' common flags, with per-launcher defaults, and
    PyTorch/XLA's launcher flags (test/args_parse.py and its AMP launchers)
    as the same flags or aliases (docs/launchers.md has the table)."""
    flags.DEFINE_bool("amp", True, "Train with automatic mixed precision "
                      "(xla_amp.autocast + xla_amp.GradScaler); --noamp trains in fp32.")
    flags.DEFINE_enum("dtype", None, sorted(DTYPES),
                      "Lower-precision dtype under autocast (default: the policy's, "
                      "bfloat16 on TPU and CPU, float16 on GPU).")
    flags.DEFINE_enum("policy", None, policy_names(),
                      "Autocast policy (op lists) to apply (default: the device's).")
    flags.DEFINE_bool("compile", False, "Compile the forward pass and the loss with "
                      "torch.compile(backend='openxla'); the backward, GradScaler and "
                      "optimizer run lazily after it (docs/compiled.md).")
    flags.DEFINE_enum("precision", None, list(PRECISIONS),
                      "Weights and compute: fp32, amp (fp32 weights, autocast), bf16 "
                      "(bf16 weights, naive), bf16_master (fp32 master copy in the "
                      "optimizer), bf16_sr (stochastic rounding). Default: amp, or fp32 "
                      "with --noamp (docs/precision_modes.md).")
    flags.DEFINE_bool("fp8", False, "Linear layers in fp8 (xla_amp.fp8: scaled float8 "
                      "matmuls; layers whose dimensions are not multiples of 16, such as a "
                      "10-way head, stay in high precision). With --precision amp or fp32 "
                      "(docs/fp8.md).")
    flags.DEFINE_enum("fp8_scaling", "delayed", ["dynamic", "delayed"],
                      "--fp8: scale from each call's amax (dynamic) or from an amax "
                      "history rolled once per optimizer step (delayed).")
    flags.DEFINE_string("module_policy", None, "Per-module policies, e.g. "
                        "'LayerNorm=fp32,head=fp32' (a torch.nn class name or a glob on "
                        "module names = a policy name or fp32).")
    flags.DEFINE_enum("optimizer", optimizer, list(OPTIMIZERS), "Optimizer.")
    flags.DEFINE_bool("syncfree", True, "Use xla_amp.syncfree optimizers (the step is "
                      "skipped on overflow inside the graph); --nosyncfree uses torch.optim "
                      "(Adam/AdamW with capturable=True), undone on overflow by the "
                      "GradScaler's masked step.")
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
    flags.DEFINE_enum("device", "auto", ["auto", "gpu"], "auto: the device PJRT_DEVICE "
                      "selects (XLA:CPU when unset); gpu: NVIDIA GPUs through JAX's CUDA "
                      "PJRT plugin (xla_amp.gpu.use_cuda_plugin; SPMD mode, cuda rules; "
                      "docs/gpu.md).")
    flags.DEFINE_bool("spmd", False, "Run in SPMD mode even on one device, as --device gpu "
                      "does (the batch is sharded over a mesh of --num_devices).")
    flags.DEFINE_bool("fsdp", False, "Shard parameters, gradients and optimizer state over "
                      "the --num_devices devices with PyTorch/XLA's FSDPv2 "
                      "(xla_amp.sharded.shard_model), the batch over the same axis; "
                      "--precision applies as on one device (docs/sharded.md).")
    flags.DEFINE_string("checkpoint", None, "Save a checkpoint to this file at the end of "
                        "each epoch, every --checkpoint_steps steps, at the end, and when "
                        "SIGTERM/SIGINT arrives (after the step in flight; exit status 75). "
                        "Written atomically; the path is locked for the whole run (a second "
                        "run on it is refused, exit status 73); a failed write ends the run "
                        "with one line and exit status 74, the previous file intact.")
    flags.DEFINE_bool("auto_resume", False, "Resume from the --checkpoint file if it exists, "
                      "otherwise start fresh: one command line for the first start and every "
                      "restart (docs/launchers.md, preemptible VMs). A damaged file (checksum "
                      "mismatch, torn) is moved to PATH.damaged and the newest intact one of "
                      "--keep_checkpoints is used; with none, exit status 2, nothing changed.")
    flags.DEFINE_integer("keep_checkpoints", 1, "Keep this many checkpoints: the newest at "
                         "--checkpoint, older ones at --checkpoint.1, .2, ... (what "
                         "--auto_resume falls back to when a newer one is damaged)",
                         lower_bound=1)
    flags.DEFINE_bool("resume_allow_rounding", False, "On a resume into bf16 weights without "
                      "a master copy (--precision bf16 / bf16_sr) from float32 values, round "
                      "them to nearest instead of refusing (docs/precision_modes.md).")
    flags.DEFINE_integer("checkpoint_steps", 0, "Also checkpoint every this many steps "
                         "(0: only at epoch ends and at the end).", lower_bound=0)
    flags.DEFINE_string("resume", None, "Resume from this checkpoint file: model, optimizer, "
                        "scaler and data position, converted to this run's --precision where "
                        "that is exact (refused in one line otherwise). Read as data only and "
                        "verified against its checksums (a damaged file: exit status 2).")
    flags.DEFINE_float("target_accuracy", None, "Exit with status 1 unless the final "
                       "held-out accuracy (percent) reaches this.",
                       lower_bound=0.0, upper_bound=100.0)
    flags.DEFINE_integer("max_steps", 0, "Stop after this many training steps in total "
                         "(counted from the start of training, across resumes; 0: no limit).",
                         lower_bound=0)
    flags.DEFINE_integer("log_steps", log_steps, "Read loss/accuracy/scale back from the "
                         "device (one transfer) every this many steps.", lower_bound=1)
    flags.DEFINE_bool("progress", True, "Show a progress bar per epoch.")
    flags.DEFINE_integer("num_workers", num_workers, "DataLoader worker processes for data "
                         "read from files (ImageFolder); in-memory data has no loader.",
                         lower_bound=0)

    # PyTorch/XLA's launchers' names for flags above, and their test-run flags
    flags.DEFINE_alias("use_syncfree_optim", "syncfree")
    flags.DEFINE_alias("num_cores", "num_devices")
    flags.DEFINE_alias("test_set_batch_size", "eval_batch_size")
    flags.DEFINE_integer("num_steps", None, "At most this many training steps per epoch, and "
                         "evaluation batches per evaluation (PyTorch/XLA's short test runs; "
                         "--max_steps counts steps over the whole run).", lower_bound=1)
    flags.DEFINE_bool("drop_last", False, "Drop the last, partial evaluation batch (default: "
                      "padded and masked, every held-out sample counts). Training always "
                      "drops an epoch's partial batch: every step has one shape, one graph.")
    flags.DEFINE_bool("metrics_debug", False, "Print torch_xla's metrics report "
                      "(torch_xla.debug.metrics.metrics_report()) after each epoch.")
    flags.DEFINE_bool("precision_report", False, "Write which op ran in which dtype "
                      "(xla_amp's precision report of the first batch's forward) and, "
                      "whenever steps were skipped, the parameters whose gradients were "
                      "inf/NaN (scaler.overflow_report, read only then) to --logdir "
                      "(markdown, JSON, TensorBoard text); printed without --logdir.")

    flags.register_validator("resume", lambda p: p is None or os.path.isfile(p)
                             or os.path.isfile(os.path.join(p, ".metadata"))
                             or os.path.isfile(os.path.join(p, "xla_amp_sharded_versions.json")),
                             message="--resume must name an existing checkpoint file, or "
                                     "with --fsdp a sharded checkpoint's directory "
                                     "(--auto_resume starts fresh when --checkpoint's file "
                                     "is not there yet)")
    flags.register_multi_flags_validator(
        ["auto_resume", "checkpoint", "resume"],
        lambda f: not f["auto_resume"] or (f["checkpoint"] and not f["resume"]),
        message="--auto_resume resumes from --checkpoint's file: give --checkpoint PATH "
                "(and no --resume)")
    flags.register_multi_flags_validator(
        ["keep_checkpoints", "checkpoint"],
        lambda f: f["keep_checkpoints"] == 1 or f["checkpoint"],
        message="--keep_checkpoints needs --checkpoint")
    flags.register_multi_flags_validator(
        ["fake_data", "datadir"], lambda f: not (f["fake_data"] and f["datadir"]),
        message="--fake_data and --datadir exclude each other")
    flags.register_multi_flags_validator(
        ["fake_data", "target_accuracy"],
        lambda f: not (f["fake_data"] and f["target_accuracy"] is not None),
        message="--target_accuracy needs real data (fake data has no accuracy)")
    flags.register_multi_flags_validator(
        ["amp", "precision", "dtype"],
        lambda f: f["dtype"] is None or (f["amp"] and f["precision"] != "fp32"),
        message="--dtype applies to autocast only (not to --noamp / --precision fp32)")
    flags.register_multi_flags_validator(
        ["amp", "precision"], lambda f: f["amp"] or f["precision"] in (None, "fp32"),
        message="--noamp is --precision fp32; the other precisions train under autocast")
    flags.register_multi_flags_validator(
        ["syncfree", "precision"],
        lambda f: f["syncfree"] or not optimizer_options(f["precision"] or "amp"),
        message="--precision bf16_master/bf16_sr need the sync-free optimizers (--syncfree)")
    flags.register_multi_flags_validator(
        ["fp8", "precision", "fsdp"],
        lambda f: not f["fp8"] or (f["precision"] in (None, "amp", "fp32") and not f["fsdp"]),
        message="--fp8 takes float32 weights (--precision amp or fp32) and one replica's "
                "layout (not --fsdp, not supported yet)")
    flags.register_validator("module_policy", _module_policy_ok,
                             message="--module_policy: entries are key=policy, the policy a "
                                     "known name or fp32")
    flags.register_multi_flags_validator(
        ["fsdp", "num_devices", "spmd"],
        lambda f: not f["fsdp"] or f["num_devices"] > 1 or f["spmd"],
        message="--fsdp shards over --num_devices devices: give --num_devices N > 1 "
                "(or --spmd for a mesh of one)")
    flags.register_multi_flags_validator(
        ["batch_size", "eval_batch_size", "num_devices"],
        lambda f: f["batch_size"] % f["num_devices"] == 0
        and (f["eval_batch_size"] or f["batch_size"]) % f["num_devices"] == 0,
        message="--batch_size and --eval_batch_size must be multiples of --num_devices")


def resolve_precision() -> str:
    """The precision the flags ask for; ``--precision fp32`` alone means
    ``--noamp`` (FLAGS.amp is set to False so every reader agrees)."""
    if FLAGS.precision == "fp32":
        FLAGS.amp = False
    return FLAGS.precision or ("amp" if FLAGS.amp else "fp32")


def policy_names() -> list[str]:
    """xla_amp's built-in policy names, read without importing xla_amp
    (torch and torch_xla take ~5 s to import: the flags are defined and
    checked before that, so a usage error or --help comes back at once)."""
    spec = importlib.util.find_spec("xla_amp")  # (finds the package, runs nothing)
    path = os.path.join(spec.submodule_search_locations[0], "policies", "_builtin.py")
    return runpy.run_path(path)["builtin_names"]()


def _module_policy_ok(text) -> bool:
    try:
        entries = module_policy_entries(text)
    except ValueError:
        return False
    if not entries:
        return True
    names = policy_names()
    return all(v == "fp32" or v in names for _, v in entries)


def apply_test_run_flags(task):
    """The task with --num_steps and --drop_last applied (PyTorch/XLA's
    meaning): at most --num_steps training steps per epoch and evaluation
    batches per evaluation; --drop_last leaves out the partial evaluation
    batch. ``task`` is an xla_amp_launch.loop.Task."""
    import dataclasses
    import itertools

    limit = FLAGS.num_steps
    if limit:
        task.train.steps_per_epoch = min(task.train.steps_per_epoch, limit)
        task = dataclasses.replace(task, compat=dict(task.compat, num_steps=limit))
    if task.evaluate is None or not (limit or FLAGS.drop_last):
        return task
    batch = FLAGS.eval_batch_size or FLAGS.batch_size
    count = min(task.eval_count, limit * batch) if limit else task.eval_count
    if FLAGS.drop_last:
        count -= count % batch
    evaluate = task.evaluate

    def limited():
        batches = itertools.islice(evaluate(), limit)  # limit None: all
        yield from (b for b in batches if not FLAGS.drop_last or bool(b[2].all()))
    return dataclasses.replace(task, evaluate=limited, eval_count=count)


def print_metrics_report() -> None:
    """--metrics_debug: torch_xla's metrics report, as PyTorch/XLA's launchers print it."""
    if FLAGS.metrics_debug:
        import torch_xla.debug.metrics as met
        print(met.metrics_report(), flush=True)
