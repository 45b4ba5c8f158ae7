"""ImageFolder data for the ImageNet launcher: DATADIR/train and DATADIR/val,
per-sample seeded augmentation, a DataLoader in the per-epoch order."""
from __future__ import annotations

import os

from xla_amp_launch.data import DataDirError, epoch_order


IMAGE_FOLDER_LAYOUT = (
    "expected an ImageFolder tree: DATADIR/train/<class>/<image> for training and, "
    "optionally, DATADIR/val/<class>/<image> with the same class folders for "
    "held-out accuracy (images: .jpg, .jpeg, .png, ...)")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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
