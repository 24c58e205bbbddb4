"""The GEMM form of kernel == stride transposed convolutions is exact (fp32), keeps state-dict keys, and only
replaces the convolutions it can."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rocm_zoo.engine.gemm_transpose import GemmConvTranspose3d, count_gemm_transposes, enable_gemm_transpose
from rocm_zoo.samples.bundles.deepedit import build_network

# fp32 sums in a different order than the convolution kernel: relative error ~1e-7; 1e-5 is the bar.
REL_TOL = 1e-5


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kernel", [(2, 2, 2), (2, 2, 1), (1, 2, 3)])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_gemm_form_equals_conv_transpose(kernel, channels_last, bias):
    torch.manual_seed(0)
    conv = nn.ConvTranspose3d(12, 5, kernel, stride=kernel, bias=bias)
    x = torch.randn(2, 12, 6, 5, 7)
    if channels_last:
        x = x.to(memory_format=torch.channels_last_3d)
    ref, out = conv(x), GemmConvTranspose3d(conv)(x)
    assert out.shape == ref.shape
    assert rel_err(out, ref) < REL_TOL


def test_output_is_channels_last_for_the_next_convolution():
    conv = nn.ConvTranspose3d(4, 3, 2, stride=2)
    out = GemmConvTranspose3d(conv)(torch.randn(1, 4, 3, 3, 3).to(memory_format=torch.channels_last_3d))
    assert out.is_contiguous(memory_format=torch.channels_last_3d)


def test_other_transposed_convolutions_are_left_alone():
    net = nn.Sequential(
        nn.ConvTranspose3d(4, 4, 3, stride=2),  # kernel != stride: overlapping blocks, not a GEMM
        nn.ConvTranspose3d(4, 4, 2, stride=2, padding=1),
        nn.ConvTranspose3d(4, 4, 2, stride=2, groups=2),
        nn.ConvTranspose3d(4, 4, 2, stride=2),
    )
    enable_gemm_transpose(net)
    assert [type(m).__name__ for m in net] == ["ConvTranspose3d"] * 3 + ["GemmConvTranspose3d"]


def test_whole_deepedit_network_is_exact_and_keeps_its_checkpoint_keys():
    torch.manual_seed(0)
    net = build_network("tiny").eval()
    keys = set(net.state_dict())
    x = torch.rand(1, 3, 64, 64, 64)
    with torch.no_grad():
        ref = net(x)
        enable_gemm_transpose(net)
        out = net(x)
    assert count_gemm_transposes(net) == 5  # the DynUNet decoder's five upsampling steps
    assert set(net.state_dict()) == keys
    assert rel_err(out, ref) < REL_TOL
    fresh = enable_gemm_transpose(build_network("tiny"))
    fresh.load_state_dict(net.state_dict(), strict=True)  # a bundle checkpoint loads strictly into the GEMM form
