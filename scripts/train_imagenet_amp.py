"""Train a torchvision ResNet with automatic mixed precision on XLA.

    # fake data (the default without --datadir): throughput on a CPU
    PJRT_DEVICE=CPU .venv/bin/python scripts/train_imagenet_amp.py \\
        --model resnet18 --image_size 64 --batch_size 16 --num_epochs 1
    # real data: an ImageFolder tree (DATADIR/train/<class>/*.jpg, DATADIR/val/<class>/*.jpg)
    ... --datadir ~/data/imagenet --model resnet50 --image_size 224 --batch_size 128
    # PyTorch/XLA's test/test_train_mp_imagenet_amp.py command lines work too:
    ... --model=resnet18 --fake_data --num_steps=2 --batch_size=4 --test_set_batch_size=4 \
        --drop_last --num_workers=0 --use_syncfree_optim --metrics_debug

The training step is the one of train_mnist_amp.py (xla_amp.autocast +
xla_amp.GradScaler + an xla_amp.syncfree optimizer, one graph per step, no
host sync inside it); see xla_amp_launch/flags.py for flags shared by both
launchers (--amp, --dtype, --policy, --optimizer, --syncfree, --num_devices,
--checkpoint/--resume, --logdir, --target_accuracy, ...).

Augmentation (random resized crop, flip) draws its random numbers from a
generator seeded by (--seed, epoch, sample index), so a resumed run sees
exactly the images an uninterrupted one would.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags

from xla_amp_launch import data, image_folder, loop
from xla_amp_launch.devices import setup_devices
from xla_amp_launch.flags import define_flags

FLAGS = flags.FLAGS

define_flags(batch_size=32, num_epochs=1, lr=0.1, optimizer="sgd",
                          momentum=0.9, weight_decay=1e-4, lr_schedule="cosine",
                          log_steps=5)
flags.DEFINE_string("model", "resnet50", "torchvision classification model "
                    "(torchvision.models.get_model name: resnet18, resnet50, ...).")
flags.DEFINE_integer("image_size", None, "Training crop size (pixels; default 299 for "
                     "inception_v3, else 224); small values (32-96) make a CPU run practical.",
                     lower_bound=16)
flags.DEFINE_integer("num_classes", 1000, "Classes with fake data (ImageFolder: the "
                     "number of class folders).", lower_bound=2)
flags.DEFINE_integer("fake_steps_per_epoch", 20, "Steps per epoch with fake data.",
                     lower_bound=1)

def _classification_models():
    import torchvision
    return sorted(torchvision.models.list_models(module=torchvision.models))


flags.register_validator(
    "model", lambda name: name in _classification_models(),
    message="--model must be a torchvision classification model name, e.g. resnet18, "
            "resnet50, mobilenet_v3_small (torchvision.models.list_models())")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    fake = FLAGS.fake_data or not FLAGS.datadir
    if fake and FLAGS.target_accuracy is not None:
        raise app.UsageError("--target_accuracy needs --datadir (fake data has no accuracy)")
    size = FLAGS.image_size or (299 if FLAGS.model == "inception_v3" else 224)
    if not fake:
        try:
            train_ds, val_ds, num_classes = image_folder.load_image_folders(
                FLAGS.datadir, size, FLAGS.seed)
        except data.DataDirError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if len(train_ds) < FLAGS.batch_size:
            print(f"error: --datadir {FLAGS.datadir!r}: train/ has {len(train_ds)} images, "
                  f"fewer than --batch_size={FLAGS.batch_size}", file=sys.stderr)
            return 2
        if val_ds is None and FLAGS.target_accuracy is not None:
            print(f"error: --target_accuracy needs {os.path.join(FLAGS.datadir, 'val')}/; "
                  f"{image_folder.IMAGE_FOLDER_LAYOUT}", file=sys.stderr)
            return 2
    else:
        num_classes = FLAGS.num_classes

    import torchvision

    devices = setup_devices(FLAGS.num_devices, FLAGS.device, FLAGS.spmd, FLAGS.fsdp)
    def build_model():
        # one output to train on (PyTorch/XLA's launcher builds inception_v3 so too)
        aux = {"aux_logits": False} if FLAGS.model in ("inception_v3", "googlenet") else {}
        return torchvision.models.get_model(FLAGS.model, weights=None, num_classes=num_classes,
                                            **aux)

    if devices.hw == "CPU" and size >= 128 and FLAGS.model not in ("resnet18",):
        print(f"note: on XLA:CPU, {FLAGS.model} at {size}x{size} takes minutes to compile "
              "and seconds per step; for a quick look try --model resnet18 --image_size 64 "
              "--batch_size 16", flush=True)
    if fake:
        train = data.FakeSource((3, size, size), num_classes, FLAGS.batch_size,
                                        FLAGS.fake_steps_per_epoch, devices, FLAGS.seed)
        task = loop.Task(
            name="imagenet", model_name=FLAGS.model, build_model=build_model, train=train,
            evaluate=None, eval_count=0,
            data_description=(f"fake data: one random batch of {FLAGS.batch_size} "
                              f"{size}x{size} images, {num_classes} classes, reused"),
            compat={"data": "fake", "image_size": size, "num_classes": num_classes})
    else:
        task = _image_folder_task(train_ds, val_ds, num_classes, size, build_model)
    return loop.train(task, devices)


def _image_folder_task(train_ds, val_ds, num_classes: int, size: int, build_model):
    eval_bs = FLAGS.eval_batch_size or FLAGS.batch_size

    def evaluate():
        import torch
        loader = torch.utils.data.DataLoader(val_ds, batch_size=eval_bs, shuffle=False,
                                             num_workers=FLAGS.num_workers)
        for xb, yb in loader:
            yield data.pad_batch(xb, yb, eval_bs)

    train = image_folder.FolderSource(train_ds, FLAGS.batch_size, FLAGS.seed, FLAGS.num_workers)
    desc = (f"ImageFolder {FLAGS.datadir}: {len(train_ds)} training"
            + (f" / {len(val_ds)} held-out" if val_ds is not None else " (no val/)")
            + f" images, {num_classes} classes, {size}x{size} crops")
    return loop.Task(
        name="imagenet", model_name=FLAGS.model, build_model=build_model, train=train,
        evaluate=evaluate if val_ds is not None else None,
        eval_count=len(val_ds) if val_ds is not None else 0, data_description=desc,
        compat={"data": os.path.abspath(FLAGS.datadir), "image_size": size,
                "num_classes": num_classes})


if __name__ == "__main__":
    app.run(main)
