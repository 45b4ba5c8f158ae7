"""Handwritten-digit data for the MNIST launcher, with no download at run time.

Two sources, both returned as ``Digits`` (float32 images ``[N, 1, 28, 28]``
scaled to [0, 1], int64 labels):

* ``load_sklearn_digits()`` (the default): the 1,797 real handwritten digits
  of the UCI "Optical Recognition of Handwritten Digits" set, as shipped in
  scikit-learn's wheel (``sklearn.datasets.load_digits``, BSD licence; 43
  writers, NIST-preprocessed). Each 8x8 image (pixel values 0..16) is resized
  to 20x20 and centred in a 28x28 frame, the way MNIST centres its
  size-normalised 20x20 digits, so the network and the ``--datadir`` path see
  the same geometry. A fixed stratified split (seed 0) holds out 20% of the
  images (360) for evaluation; the rest (1,437) is the training set.

  Why this source: scikit-learn is already a requirement of this project, the
  data is real handwriting (not synthetic) from a well-known public set, the
  file is inside the installed package (nothing is fetched), and it is small
  enough that the default run trains to >= 97% held-out accuracy in about two
  minutes on two CPU cores. Full MNIST (70,000 images) would need either a
  download or an extra package of uncertain provenance that ships 11 MB of
  data; users who have it point ``--datadir`` at it instead.

* ``load_mnist_idx(datadir)``: the standard MNIST idx files
  (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
  ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each optionally
  ``.gz``), in ``datadir`` itself or in ``datadir/MNIST/raw`` (torchvision's
  layout). Anything missing or malformed raises ``DataDirError`` with one
  message naming the path and the expected layout.
"""
from __future__ import annotations

import dataclasses
import gzip
import os
import struct
from importlib import metadata

import numpy as np
import torch

from xla_amp_launch import data_cache
from xla_amp_launch.data import DataDirError

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IDX_LAYOUT = (
    "expected the four MNIST idx files "
    + ", ".join(MNIST_FILES.values())
    + " (each optionally gzipped, *.gz) directly in the directory or in its"
    " MNIST/raw/ subdirectory")

# Normalisation used for both sources (MNIST's customary mean and std).
MEAN, STD = 0.1307, 0.3081


@dataclasses.dataclass
class Digits:
    train_x: torch.Tensor  # float32 [N, 1, 28, 28], values in [0, 1]
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str

    def describe(self) -> str:
        return (f"{self.source}: {len(self.train_y)} training / "
                f"{len(self.test_y)} held-out images, 28x28")


def normalize(x: torch.Tensor) -> torch.Tensor:
    return (x - MEAN) / STD


def random_shift(x: torch.Tensor, generator: torch.Generator, max_shift: int = 2) -> torch.Tensor:
    """Translate each image of a batch ``[N, 1, H, W]`` by up to ``max_shift``
    pixels in each direction (zero fill): cheap augmentation that keeps a
    small training set from being memorised."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (max_shift,) * 4)
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None, :])            # [N, H]
    cols = (dx[:, None] + torch.arange(w)[None, :])            # [N, W]
    batch = torch.arange(n)[:, None, None]
    return padded[:, 0][batch, rows[:, :, None], cols[:, None, :]].unsqueeze(1)


def load_sklearn_digits(test_fraction: float = 0.2, split_seed: int = 0) -> Digits:
    """The scikit-learn digits, split and framed (see the module docstring).
    Prepared once per scikit-learn and torch version and kept on disk
    (xla_amp_launch/data_cache.py): a later run reads the tensors back
    instead of importing scikit-learn (about a second of every start)."""
    key = {"sklearn": metadata.version("scikit-learn"), "torch": torch.__version__,
           "test_fraction": test_fraction, "split_seed": split_seed, "format": 1}
    t = data_cache.cached("sklearn-digits", key,
                          lambda: _prepare_sklearn_digits(test_fraction, split_seed))
    return Digits(t["train_x"], t["train_y"], t["test_x"], t["test_y"],
                  source="scikit-learn digits (UCI handwritten, 8x8 upsampled to 28x28)")


def _prepare_sklearn_digits(test_fraction: float, split_seed: int) -> dict[str, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images = torch.from_numpy(d.images.astype(np.float32) / 16.0).unsqueeze(1)
    images = torch.nn.functional.interpolate(images, size=(20, 20), mode="bilinear",
                                             align_corners=False)
    images = torch.nn.functional.pad(images, (4, 4, 4, 4)).clamp_(0.0, 1.0)
    labels = torch.from_numpy(d.target.astype(np.int64))
    idx_train, idx_test = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, random_state=split_seed,
        stratify=d.target)
    idx_train, idx_test = torch.from_numpy(idx_train), torch.from_numpy(idx_test)
    return {"train_x": images[idx_train].contiguous(), "train_y": labels[idx_train].contiguous(),
            "test_x": images[idx_test].contiguous(), "test_y": labels[idx_test].contiguous()}


def _find(datadir: str, stem: str) -> str | None:
    for folder in (datadir, os.path.join(datadir, "MNIST", "raw")):
        for name in (stem, stem + ".gz"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    return None


def _read_idx(path: str, datadir: str, magic: int, ndim: int) -> np.ndarray:
    def fail(problem):
        raise DataDirError(f"--datadir {datadir!r}: {problem}; {IDX_LAYOUT}.")

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        fail(f"cannot read {path!r} ({e})")
    header = 4 + 4 * ndim
    if len(raw) < header:
        fail(f"{path!r} is too short to be an idx file ({len(raw)} bytes)")
    (found_magic,) = struct.unpack(">I", raw[:4])
    if found_magic != magic:
        fail(f"{path!r} has magic number 0x{found_magic:08x}, expected 0x{magic:08x} "
             f"(unsigned bytes, {ndim} dimension{'s' if ndim > 1 else ''})")
    dims = struct.unpack(">" + "I" * ndim, raw[4:header])
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        fail(f"{path!r} declares shape {tuple(dims)} ({expected} bytes of data) but "
             f"holds {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_mnist_idx(datadir: str) -> Digits:
    if not os.path.isdir(datadir):
        raise DataDirError(f"--datadir {datadir!r} is not a directory; {IDX_LAYOUT}.")
    paths = {key: _find(datadir, stem) for key, stem in MNIST_FILES.items()}
    missing = [MNIST_FILES[k] for k, p in paths.items() if p is None]
    if missing:
        raise DataDirError(f"--datadir {datadir!r} has no {', '.join(missing)}; "
                           f"{IDX_LAYOUT}.")
    arrays = {}
    for key, path in paths.items():
        is_images = key.endswith("images")
        arrays[key] = _read_idx(path, datadir, 0x803 if is_images else 0x801,
                                3 if is_images else 1)
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.shape[1:] != (28, 28):
            raise DataDirError(f"--datadir {datadir!r}: {paths[split + '_images']!r} holds "
                               f"{images.shape[1]}x{images.shape[2]} images, expected 28x28; "
                               f"{IDX_LAYOUT}.")
        if len(images) != len(labels):
            raise DataDirError(f"--datadir {datadir!r}: {len(images)} {split} images but "
                               f"{len(labels)} {split} labels; {IDX_LAYOUT}.")
        if len(labels) and labels.max() > 9:
            raise DataDirError(f"--datadir {datadir!r}: {paths[split + '_labels']!r} has "
                               f"label {int(labels.max())}, expected 0..9; {IDX_LAYOUT}.")

    def images(a):
        return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1)

    def labels(a):
        return torch.from_numpy(a.astype(np.int64))

    return Digits(images(arrays["train_images"]), labels(arrays["train_labels"]),
                  images(arrays["test_images"]), labels(arrays["test_labels"]),
                  source=f"MNIST idx files in {datadir}")


def write_mnist_idx(datadir: str, digits: Digits, gz: bool = False) -> None:
    """Write ``digits`` as the four idx files (used by the tests; also handy to
    export the scikit-learn set in MNIST's format)."""
    os.makedirs(datadir, exist_ok=True)
    opener = gzip.open if gz else open
    for split in ("train", "test"):
        x = getattr(digits, f"{split}_x")
        y = getattr(digits, f"{split}_y")
        pix = (x.squeeze(1).clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        with opener(os.path.join(datadir, MNIST_FILES[f"{split}_images"]
                                 + (".gz" if gz else "")), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, *pix.shape) + pix.tobytes())
        lab = y.to(torch.uint8).numpy()
        with opener(os.path.join(datadir, MNIST_FILES[f"{split}_labels"]
                                 + (".gz" if gz else "")), "wb") as f:
            f.write(struct.pack(">II", 0x801, len(lab)) + lab.tobytes())


class MNISTNet(torch.nn.Module):
    """conv(3x3) - relu - conv(3x3) - relu - maxpool(2) - fc - relu - fc.

    The launcher's network, and the one ``benchmarks/peers.py`` trains in every
    framework (its JAX twin mirrors these layers and their layouts). With the
    default sizes (32 and 64 channels, 128 hidden units; 1.2 M parameters)
    the default run reaches >= 97% held-out accuracy within a few epochs.
    """

    def __init__(self, channels: tuple[int, int] = (32, 64), hidden: int = 128,
                 num_classes: int = 10):
        super().__init__()
        c1, c2 = channels
        self.conv1 = torch.nn.Conv2d(1, c1, kernel_size=3)
        self.conv2 = torch.nn.Conv2d(c1, c2, kernel_size=3)
        self.fc1 = torch.nn.Linear(c2 * 12 * 12, hidden)
        self.fc2 = torch.nn.Linear(hidden, num_classes)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)
