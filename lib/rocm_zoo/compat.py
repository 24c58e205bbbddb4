"""Shims that let real Model Zoo bundles run on the MONAI and torch installed here, usable as a config `_target_`.

Each shim fixes one known incompatibility between a bundle's shipped config and current MONAI, keeps every other
argument as the bundle gives it, and says in the log what it changed.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["swin_unetr"]


def swin_unetr(**kwargs: Any) -> nn.Module:
    """MONAI's SwinUNETR from a bundle's `network_def` arguments.

    swin_unetr_btcv_segmentation (0.5.x) passes `img_size`, which MONAI deprecated in 1.3 and removed in 1.5
    (`TypeError: ... unexpected keyword argument 'img_size'`). It only ever checked the input size, which SwinUNETR
    now checks at forward time, so dropping it changes no layer. It is passed on where the installed MONAI still
    accepts it. In a config: `"network_def#_target_": "rocm_zoo.compat.swin_unetr"`.
    """
    from monai.networks.nets import SwinUNETR

    if "img_size" in kwargs and "img_size" not in inspect.signature(SwinUNETR.__init__).parameters:
        img_size = kwargs.pop("img_size")
        logger.warning("SwinUNETR: dropped img_size=%r from the bundle config: this MONAI's SwinUNETR no longer "
                       "takes it (removed in MONAI 1.5; it only checked the input size)", img_size)
    return SwinUNETR(**kwargs)
