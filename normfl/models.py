"""Models of the papers. Each builder takes the data shape and class count from the dataset.

- ``resnet20``: Idelbayev's CIFAR ResNet20 (option-A shortcuts, kaiming_normal_ init), 269,722
  parameters on 3x32x32 input; ``norm=group`` swaps BatchNorm for GroupNorm.
- ``mlp``: DP-NormFedAvg's two-hidden-layer ReLU network (300 units on FMNIST, 600 on CIFAR-10).
- ``cnn``: ALI-DPFL's FedAvgCNN (two 5x5 conv + max-pool stages, a 512-unit hidden layer).
- ``logreg``: a linear softmax model, optionally zero-initialised, for theory-style problems.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import nn


def _norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    raise ValueError(f"model.norm={kind!r} is not allowed; use 'batch' or 'group'")


class ShortcutA(nn.Module):
    """Option A's shortcut where a block changes shape: stride-2 subsampling, channels zero-padded
    from c_in to c_out (half the padding on each side)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.c_in, self.pad = c_in, (c_out - c_in) // 2

    def forward(self, x):
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = _norm_layer(norm, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = _norm_layer(norm, c_out)
        self.shortcut = ShortcutA(c_in, c_out) if (stride != 1 or c_in != c_out) else nn.Identity()

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 10, norm: str = "batch"):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = _norm_layer(norm, 16)
        blocks, c_in = [], 16
        for c_out, stride in ((16, 1), (32, 2), (64, 2)):
            for j in range(3):
                blocks.append(_BasicBlock(c_in, c_out, stride if j == 0 else 1, norm))
                c_in = c_out
        self.layers = nn.Sequential(*blocks)
        self.linear = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x):
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def resnet20(in_shape, num_classes: int, norm: str = "batch") -> nn.Module:
    return ResNet20(in_shape[0], num_classes, norm)


def mlp(in_shape, num_classes: int, hidden: list[int] | tuple[int, ...] = (300, 300)) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(in_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def cnn(in_shape, num_classes: int, hidden: int = 512) -> nn.Module:
    c, h, w = in_shape
    side_h, side_w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(c, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * side_h * side_w, hidden), nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def logreg(in_shape, num_classes: int, init: str = "default") -> nn.Module:
    model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), num_classes))
    if init == "zeros":
        nn.init.zeros_(model[1].weight)
        nn.init.zeros_(model[1].bias)
    elif init != "default":
        raise ValueError(f"model.init={init!r} is not allowed; use 'default' or 'zeros'")
    return model
