"""A sliding window's short last batch runs the warmed full-batch graph (padded), with the same result and no
recompile; other shapes are left alone."""

from __future__ import annotations

import torch
from torch import nn

from rocm_zoo.engine.backend import detect_backend
from rocm_zoo.engine.overlay import OverlaySettings
from rocm_zoo.engine.pool import PoolKey, WarmNetwork, compiled_graphs


def warm_conv(compile_it: bool) -> WarmNetwork:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.InstanceNorm3d(4)).eval()
    runner = torch.compile(net, dynamic=False) if compile_it else net
    key = PoolKey("toy", "cpu", "float32", "contiguous", "default" if compile_it else "eager", False)
    return WarmNetwork(key, net, runner, detect_backend("cpu"), OverlaySettings(), None, 0.0)


def test_short_batch_is_padded_to_the_warmed_batch_and_gives_the_same_result():
    net = warm_conv(compile_it=True)
    net.warm([(4, 1, 8, 8, 8)])
    graphs = compiled_graphs()
    x = torch.rand(3, 1, 8, 8, 8)
    assert net.padded_batch(tuple(x.shape)) == 4
    out = net(x)
    assert out.shape == (3, 4, 8, 8, 8)
    assert torch.allclose(out, net.eager(x), atol=1e-5)  # per-sample ops: padding changes nothing
    assert compiled_graphs() == graphs, "the short batch compiled a new graph"


def test_other_windows_are_not_padded():
    net = warm_conv(compile_it=False)
    net.warmed_shapes.append((4, 1, 8, 8, 8))
    assert net.padded_batch((2, 1, 8, 8, 6)) == 2
    assert net.padded_batch((4, 1, 8, 8, 8)) == 4
    assert net.padded_batch((5, 1, 8, 8, 8)) == 5


def test_one_channel_inputs_of_any_layout_run_the_warmed_graph():
    # The same bytes reach a network with different strides: a click's window sliced from the image, one padded to
    # the window, a one-channel tensor whose channel stride is 1 (channels-last). Dynamo guards on every stride, so
    # without one layout at the entry each of these compiled again (VISTA3D's encoder on a first click: 10 s, H200).
    net = warm_conv(compile_it=True)
    net.warm([(1, 1, 8, 8, 8)])
    graphs = compiled_graphs()
    data = torch.rand(1, 1, 8, 8, 8)
    channel_stride_one = torch.empty(1, 1, 8, 8, 8, memory_format=torch.channels_last_3d).copy_(data)
    window = torch.zeros(1, 1, 12, 10, 9)
    window[..., 2:10, 1:9, :8] = data
    for x in (data, channel_stride_one, window[..., 2:10, 1:9, :8], data[:, :1]):
        assert torch.allclose(net(x), net.eager(data), atol=1e-5)
    assert compiled_graphs() == graphs, "an input layout compiled a new graph"
