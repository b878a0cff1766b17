"""A ResNet-like convolutional chain whose activations shrink with depth (He et al. 2016, with the
pre-activation blocks of "Identity mappings in deep residual networks"), cut into stages.

    >>> from profiler.models.conv import ConvConfig, build_conv
    >>> stages, images = build_conv(ConvConfig())

Stages: the stem (conv 3x3), then one stage per residual block, then the head (BatchNorm, ReLU,
global average pool, linear, cross-entropy against the targets it holds). Each block is
pre-activation: BN -> ReLU -> conv -> BN -> ReLU -> conv, plus the shortcut (a strided 1x1 conv when
the block halves the resolution and doubles the channels), and ends with the residual add, so a
stage's output is never among its own saved tensors. Every group halves the spatial size and
doubles the channels, so each group's activations are half the size of the previous group's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ConvConfig", "ConvStem", "ResBlock", "ConvHead", "build_conv"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ConvConfig:
    channels: tuple[int, ...] = (16, 32, 64)  # channels per group; each later group halves H and W
    blocks: tuple[int, ...] = (2, 2, 2)  # residual blocks per group (ResNet-18: (2, 2, 2, 2))
    image_size: int = 32  # H = W of the input images
    in_channels: int = 3
    num_classes: int = 10
    batch_size: int = 8
    dtype: str = "float32"  # parameter and compute dtype
    seed: int = 0

    def __post_init__(self) -> None:
        self.channels, self.blocks = tuple(self.channels), tuple(self.blocks)
        for name in ("channels", "blocks"):  # each list's own entries before their pairing
            if any(v < 1 for v in getattr(self, name)):
                raise ValueError(f"{name}: every entry must be a positive integer, got "
                                 f"{','.join(map(str, getattr(self, name)))}")
        if not self.channels or len(self.channels) != len(self.blocks):
            raise ValueError(
                f"blocks: give one block count per group of channels ({len(self.channels)}), got {len(self.blocks)}"
            )
        for name in ("image_size", "in_channels", "num_classes", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be a positive integer, got {getattr(self, name)}")
        if self.image_size % (2 ** (len(self.channels) - 1)):
            raise ValueError(
                f"image_size: {self.image_size} must be divisible by 2^{len(self.channels) - 1} "
                "(each group after the first halves it)"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: choose one of {', '.join(_DTYPES)}, not {self.dtype!r}")


class ConvStem(nn.Module):
    def __init__(self, cfg: ConvConfig):
        super().__init__()
        self.conv = nn.Conv2d(cfg.in_channels, cfg.channels[0], 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)  # (B, C0, H, W)


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False) if stride != 1 or c_in != c_out else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(x))  # (B, c_in, H, W)
        skip = x if self.shortcut is None else self.shortcut(h)  # (B, c_out, H/s, W/s)
        h = self.conv1(h)  # (B, c_out, H/s, W/s)
        h = self.conv2(F.relu(self.bn2(h)))  # (B, c_out, H/s, W/s)
        return h + skip  # the residual add ends the block


class ConvHead(nn.Module):
    def __init__(self, cfg: ConvConfig):
        super().__init__()
        self.bn = nn.BatchNorm2d(cfg.channels[-1])
        self.fc = nn.Linear(cfg.channels[-1], cfg.num_classes)
        self.register_buffer("targets", torch.zeros(cfg.batch_size, dtype=torch.long))  # (B,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(x)).mean(dim=(2, 3))  # (B, C)
        return F.cross_entropy(self.fc(h).float(), self.targets)  # ()


def build_conv(cfg: ConvConfig | None = None, *, device: str | torch.device = "cpu"):
    """`(stages, example_input)`: [ConvStem, ResBlock x sum(blocks), ConvHead] (train mode, on
    `device`, in `cfg.dtype`) and a batch of images (B, in_channels, H, W); the head's targets are
    random classes."""
    cfg = cfg or ConvConfig()
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        stages: list[nn.Module] = [ConvStem(cfg)]
        names = ["stem"]
        c_prev = cfg.channels[0]
        for g, (c, n) in enumerate(zip(cfg.channels, cfg.blocks, strict=True)):
            for k in range(n):
                stride = 2 if (g > 0 and k == 0) else 1
                stages.append(ResBlock(c_prev, c, stride))
                names.append(f"layer{g + 1}.{k}")
                c_prev = c
        head = ConvHead(cfg)
        stages.append(head)
        names.append("head")
    images = torch.randn(cfg.batch_size, cfg.in_channels, cfg.image_size, cfg.image_size, generator=gen)
    head.targets.copy_(torch.randint(0, cfg.num_classes, (cfg.batch_size,), generator=gen))
    dtype = _DTYPES[cfg.dtype]
    for stage, name in zip(stages, names, strict=True):
        stage.to(device=device, dtype=dtype)
        stage.train()
        stage.memplan_name = name
        stage.memplan_kind = "stem" if name == "stem" else ("head" if name == "head" else "block")
    stages[0].memplan_config = {"family": "conv", **asdict(cfg)}
    return stages, images.to(device=device, dtype=dtype)
