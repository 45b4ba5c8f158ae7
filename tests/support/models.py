"""Small models several test folders build."""
import torch.nn as nn


def mnist_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
        nn.Linear(16 * 11 * 11, 32), nn.ReLU(), nn.Linear(32, 10))
