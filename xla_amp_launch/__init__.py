"""The AMP launchers' shared machinery (scripts/train_mnist_amp.py,
scripts/train_imagenet_amp.py), one module per job:

    flags         the common command-line flags
    devices       one XLA device or an SPMD data-parallel mesh
    data          in-memory and fake batches, exact per-epoch order
    digits        the MNIST-style digits data (sklearn's, or MNIST idx files) and the CNN
    image_folder  ImageFolder data for the ImageNet launcher
    checkpoint    save / resume (model, optimizer, scaler, data position)
    metrics       XLA counters, progress bar
    loop          setup / train_epoch / evaluate and the training step
    summary       the final summary and exit status

Checkpoints (``--checkpoint``) hold the model, optimizer and scaler state and
the data position (epoch, step within the epoch). Each epoch's sample order
is a permutation drawn from ``--seed`` and the epoch number alone, so a run
resumed with ``--resume`` takes exactly the batches, and produces exactly the
parameters, of an uninterrupted one.
"""
