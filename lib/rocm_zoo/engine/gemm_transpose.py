"""The exact GEMM form of a transposed convolution whose kernel equals its stride.

With kernel == stride (no padding, dilation or groups) the output blocks of a ConvTranspose3d do not overlap:
every input voxel writes its own a x b x c block, which is one matrix product per voxel
(channels_in -> channels_out * a*b*c) followed by a voxel shuffle. A GEMM runs at full matrix-unit speed on every
backend, where strided transposed convolutions often fall back to slow kernels (MIOpen especially).
AMD's MONAI fork calls this DynUNet `enable_gemm_transpose(True)`; upstream MONAI has no such switch, so it lives here
and works on any module tree.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


def is_gemm_equivalent(conv: nn.Module) -> bool:
    return (
        isinstance(conv, nn.ConvTranspose3d)
        and tuple(conv.kernel_size) == tuple(conv.stride)
        and tuple(conv.padding) == (0, 0, 0)
        and tuple(conv.output_padding) == (0, 0, 0)
        and tuple(conv.dilation) == (1, 1, 1)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
    )


class GemmConvTranspose3d(nn.Module):
    """Drop-in for a kernel == stride ConvTranspose3d. Keeps `weight` and `bias` under the same names and shapes,
    so a checkpoint of the original network loads strictly into the converted one and back."""

    def __init__(self, conv: nn.ConvTranspose3d):
        super().__init__()
        if not is_gemm_equivalent(conv):
            raise ValueError(f"{conv} is not kernel == stride without padding, dilation or groups")
        self.weight = conv.weight  # (C_in, C_out, a, b, c): shared, not copied
        self.bias = conv.bias
        self.kernel_size = tuple(conv.kernel_size)
        self.in_channels = conv.in_channels
        self.out_channels = conv.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, d, h, w = x.shape
        a, b, c = self.kernel_size
        # (C_in, a, b, c, C_out): the output block is laid out channels-last, so the shuffle below yields a
        # channels_last_3d tensor directly and the next convolution needs no layout change.
        weight = self.weight.permute(0, 2, 3, 4, 1).reshape(self.in_channels, a * b * c * self.out_channels)
        y = x.permute(0, 2, 3, 4, 1).reshape(n * d * h * w, self.in_channels) @ weight.to(x.dtype)
        y = y.view(n, d, h, w, a, b, c, self.out_channels).permute(0, 1, 4, 2, 5, 3, 6, 7)
        y = y.reshape(n, d * a, h * b, w * c, self.out_channels)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.permute(0, 4, 1, 2, 3)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size=stride={self.kernel_size}"


def enable_gemm_transpose(module: nn.Module) -> nn.Module:
    """Replace, in place, every kernel == stride ConvTranspose3d under `module` by its GEMM form; returns `module`."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if is_gemm_equivalent(child):
                setattr(parent, name, GemmConvTranspose3d(child))
                replaced += 1
    logger.info("gemm transpose: %d transposed convolutions replaced by their GEMM form", replaced)
    return module


def count_gemm_transposes(module: nn.Module) -> int:
    return sum(isinstance(m, GemmConvTranspose3d) for m in module.modules())
