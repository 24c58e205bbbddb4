"""Shims that let real Model Zoo bundles run on the MONAI and torch installed here, usable as a config `_target_`.

Each shim fixes one known incompatibility between a bundle's shipped config and current MONAI, keeps every other
argument as the bundle gives it, and says in the log what it changed.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from monai.networks.nets import TopologyInstance
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["swin_unetr", "dints", "StaticTopologyInstance"]


def swin_unetr(**kwargs: Any) -> nn.Module:
    """MONAI's SwinUNETR from a bundle's `network_def` arguments.

    swin_unetr_btcv_segmentation (0.5.x) passes `img_size`, which MONAI deprecated in 1.3 and removed in 1.5
    (`TypeError: ... unexpected keyword argument 'img_size'`). It only ever checked the input size, which SwinUNETR
    now checks at forward time, so dropping it changes no layer. It is passed on where the installed MONAI still
    accepts it. In a config: `"network_def#_target_": "rocm_zoo.engine.compat.swin_unetr"`.
    """
    from monai.networks.nets import SwinUNETR

    if "img_size" in kwargs and "img_size" not in inspect.signature(SwinUNETR.__init__).parameters:
        img_size = kwargs.pop("img_size")
        logger.warning("SwinUNETR: dropped img_size=%r from the bundle config: this MONAI's SwinUNETR no longer "
                       "takes it (removed in MONAI 1.5; it only checked the input size)", img_size)
    return SwinUNETR(**kwargs)


# DiNTS (pancreas_ct_dints_segmentation). Its forward branches on architecture-code tensors (`if self.node_a[0][d]`,
# `if activation:` over `arch_code_a`), so Dynamo cannot trace it as one graph: it breaks at every branch and hits the
# recompile limit. The searched architecture is fixed once the arch code is loaded, so the branches can be decided
# then, as Python constants. Same modules, same parameters and state-dict keys, same arithmetic in the same order.


class StaticTopologyInstance(TopologyInstance):
    """MONAI's TopologyInstance with its active cells fixed at construction. In a config:
    `"dints_space#_target_": "rocm_zoo.engine.compat.StaticTopologyInstance"`."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.active_cells = tuple(
            tuple(res for res, on in enumerate(torch.as_tensor(row).tolist()) if on) for row in self.arch_code_a
        )

    def forward(self, x: list[torch.Tensor]) -> list[torch.Tensor]:
        inputs = x
        for blk_idx, active in enumerate(self.active_cells):
            outputs = [torch.tensor(0.0, dtype=x[0].dtype, device=x[0].device)] * self.num_depths
            for res_idx in active:
                cell = self.cell_tree[str((blk_idx, res_idx))]
                out = cell(x=inputs[self.arch_code2in[res_idx]], weight=None)
                outputs[self.arch_code2out[res_idx]] = outputs[self.arch_code2out[res_idx]] + out
            inputs = outputs
        return inputs


def dints(**kwargs: Any) -> nn.Module:
    """MONAI's DiNTS from a bundle's `network_def` arguments, its node activations as Python booleans (the forward
    only indexes them, so it runs unchanged). In a config: `"network_def#_target_": "rocm_zoo.engine.compat.dints"`."""
    from monai.networks.nets import DiNTS

    network = DiNTS(**kwargs)
    network.node_a = [[bool(v) for v in row] for row in torch.as_tensor(network.node_a).tolist()]
    return network
