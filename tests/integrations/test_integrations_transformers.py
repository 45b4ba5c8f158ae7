"""xla_amp.integrations.transformers.XLAAMPTrainer: the Transformers
Trainer's --bf16 / --fp16 on XLA:CPU through xla_amp, on a small GPT-2
trained 20 steps on the Python standard library's own sources (tests/support/
lm.py's corpus: shipped with Python, nothing downloaded)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from tests.support.byte_lm import corpus  # noqa: E402
from tests.support.integrations import close, xla_env_vars  # noqa: E402
import xla_amp  # noqa: E402
from xla_amp import syncfree  # noqa: E402
from xla_amp.integrations.transformers import XLAAMPTrainer  # noqa: E402

pytestmark = pytest.mark.integrations
CONTEXT, BATCH, STEPS = 64, 4, 20
COMPUTE = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": torch.float32}


def dataset():
    src = corpus(STEPS * BATCH * CONTEXT)
    return [{"input_ids": w, "labels": w} for w in src.view(STEPS * BATCH, CONTEXT)]


def train(precision, tmp_path, trainer_cls=XLAAMPTrainer, gradient_checkpointing=False, **kw):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=64, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    dtypes, env = set(), []

    def seen(module, inputs, output):
        dtypes.add(output.dtype)
        env.append(xla_env_vars())
    model.transformer.h[0].attn.c_attn.register_forward_hook(seen)  # GPT-2's Conv1D: addmm
    # adamw_torch: the Trainer's default, adamw_torch_fused, is refused by
    # torch on XLA parameters (fused=True supports cuda, cpu, ...), stock or not
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / precision), max_steps=STEPS, per_device_train_batch_size=BATCH,
        learning_rate=3e-3, optim="adamw_torch", logging_steps=1, report_to=[],
        save_strategy="no", seed=0, disable_tqdm=True,
        bf16=precision == "bf16", fp16=precision == "fp16",
        # no pinned host memory: once a test in this worker imported torchax
        # (torch_xla's mark_sharding does), torch's accelerator is "jax" and
        # DataLoader pinning fails (docs/upstream/privateuse1_accelerator_...)
        dataloader_pin_memory=False, gradient_checkpointing=gradient_checkpointing)
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset(), **kw)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == STEPS
    return trainer, losses, dtypes, env


@pytest.fixture(scope="module")
def fp32_losses(tmp_path_factory):
    _, losses, dtypes, _ = train("no", tmp_path_factory.mktemp("fp32"), transformers.Trainer)
    assert dtypes == {torch.float32}
    return losses


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_bf16_and_fp16_train_through_xla_amp(precision, fp32_losses, tmp_path):
    stock = transformers.trainer.Accelerator
    trainer, losses, dtypes, env = train(
        precision, tmp_path, xla_amp_policy="cuda" if precision == "fp16" else None)
    assert dtypes == {COMPUTE[precision]}
    close(losses, fp32_losses)
    assert all(e == {} for e in env) and xla_env_vars() == {}
    assert transformers.trainer.Accelerator is stock  # put back after the Trainer made its own
    assert trainer.accelerator.mixed_precision == precision
    assert trainer.accelerator.state.mixed_precision == "no"  # Accelerate's own AMP stayed off
    inner = trainer.optimizer.optimizer
    assert isinstance(inner, syncfree.AdamW)  # adamw_torch, swapped: it takes found_inf
    assert inner.param_groups[0]["lr"] == trainer.lr_scheduler.get_last_lr()[0]
    scaler = trainer.accelerator.scaler
    if precision == "fp16":
        assert isinstance(scaler, xla_amp.GradScaler)
        assert scaler.skipped_steps() < STEPS // 2  # it trained, it did not skip its way through
    else:
        assert scaler is None


def test_fp8_through_the_trainer(fp32_losses, tmp_path):
    """XLAAMPTrainer(xla_amp_fp8=recipe) with bf16=True: GPT-2's Conv1D
    layers and its tied head in fp8, the histories rolled by the Trainer's
    optimizer steps; the loss follows fp32's."""
    from xla_amp.fp8 import Fp8Linear, Fp8Recipe
    trainer, losses, _, env = train("bf16", tmp_path, xla_amp_fp8=Fp8Recipe(scaling="delayed"))
    layers = [m for m in trainer.model.modules() if isinstance(m, Fp8Linear)]
    assert len(layers) == 9
    close(losses, fp32_losses, rel=0.03)
    assert (layers[0].fp8_amax_history[:, :STEPS - 4].cpu() > 0).all()  # rolled every step
    assert all(e == {} for e in env)


def test_gradient_checkpointing_through_the_trainer(tmp_path):
    """TrainingArguments(gradient_checkpointing=True), Transformers' own
    (torch.utils.checkpoint, non-reentrant), under the tpu rules, which are not
    XLA:CPU's default: every recompute replays them, so the 20 losses equal the
    run without checkpointing bit for bit (the recompute under the default rules
    raised CheckpointError; without xla_amp's ``torch.xla``, AttributeError)."""
    plain, plain_losses, _, _ = train("bf16", tmp_path / "plain", xla_amp_policy="tpu")
    trainer, losses, dtypes, _ = train("bf16", tmp_path / "checkpointed", xla_amp_policy="tpu",
                                       gradient_checkpointing=True)
    assert trainer.model.transformer.h[0].gradient_checkpointing
    assert not plain.model.transformer.h[0].gradient_checkpointing
    assert dtypes == {torch.bfloat16}
    assert losses == plain_losses
