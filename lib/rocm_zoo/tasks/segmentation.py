"""Automatic segmentation with a sliding-window bundle (wholeBody_ct, swin_unetr_btcv, pancreas_ct_dints).

The bundle's own transforms, inferer and post-processing run as MONAI Label runs them; the network is the pool's
warm compiled one. Every window batch the inferer makes has the bundle's `(sw_batch_size, channels, *roi_size)`
shape (a volume smaller than the window is padded to it by MONAI; a short last batch is padded by the pool), so that
one shape, warmed at start-up, serves every volume size.
"""

from __future__ import annotations

import json
from pathlib import Path

from monai.utils import ensure_tuple_rep

from rocm_zoo.errors import ConfigError
from rocm_zoo.tasks.bundle_task import OverlayBundleTask


def input_channels(bundle_dir: Path) -> int:
    """From the bundle's metadata, where every Model Zoo bundle declares its network input."""
    meta = json.loads((Path(bundle_dir) / "configs" / "metadata.json").read_text())
    try:
        return int(meta["network_data_format"]["inputs"]["image"]["num_channels"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{bundle_dir}/configs/metadata.json has no network_data_format.inputs.image.num_channels") from e


class SegmentationTask(OverlayBundleTask):
    def warm_shapes(self) -> list[tuple[int, ...]]:
        inferer = self.inferer()
        roi = getattr(inferer, "roi_size", None)
        if roi is None:
            raise ConfigError(f"{self.entry.bundle}: its inferer {type(inferer).__name__} has no roi_size; "
                              "a segmentation task needs a sliding-window inferer")
        batch = int(getattr(inferer, "sw_batch_size", 1))
        spatial = tuple(int(r) for r in ensure_tuple_rep(roi, 3))
        return [(batch, input_channels(Path(self.bundle_path)), *spatial)]
