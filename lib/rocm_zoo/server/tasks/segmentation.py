"""Automatic segmentation with a sliding-window bundle (wholeBody_ct, swin_unetr_btcv, pancreas_ct_dints).

The bundle's own transforms, inferer and post-processing run as MONAI Label runs them; the network is the pool's
warm compiled one. Every window batch the inferer makes has the bundle's `(sw_batch_size, channels, *roi_size)`
shape (a volume smaller than the window is padded to it by MONAI; a short last batch is padded by the pool), so that
one shape, warmed at start-up, serves every volume size.

The whole path stays on the device: the file is read on the host, then resampling, intensity scaling, the sliding
window, stitching, argmax and the inversion to the original grid run where the network runs, and the label comes back
once, as uint8. Memory is what bounds a whole-body CT: the stitching buffer holds every class over the resampled
volume. It is kept in the overlay's `stitch_dtype`, the bundle's softmax directly before its argmax is skipped (same
argmax, no second full-size copy), and a volume that still does not fit is stitched in host memory instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict

import torch
from monai.transforms import Activationsd, AsDiscreted
from monai.utils import ensure_tuple_rep

from rocm_zoo.engine.backend import is_out_of_memory
from rocm_zoo.engine.overlay import STITCH_DTYPES
from rocm_zoo.errors import ConfigError, VolumeTooLarge
from rocm_zoo.server.tasks.bundle import OverlayBundleTask

logger = logging.getLogger(__name__)


def input_channels(bundle_dir: Path) -> int:
    """From the bundle's metadata, where every Model Zoo bundle declares its network input."""
    meta = json.loads((Path(bundle_dir) / "configs" / "metadata.json").read_text())
    try:
        return int(meta["network_data_format"]["inputs"]["image"]["num_channels"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{bundle_dir}/configs/metadata.json has no network_data_format.inputs.image.num_channels") from e


def _is_softmax(t: Any) -> bool:
    return isinstance(t, Activationsd) and all(t.softmax) and not any(t.sigmoid) and not any(t.other)


def _is_argmax(t: Any) -> bool:
    return isinstance(t, AsDiscreted) and all(t.argmax)


def without_softmax_before_argmax(transforms: list) -> list:
    """The bundle's post-processing with a softmax dropped where an argmax over the same keys follows it directly:
    softmax keeps the order of the scores, so the argmax is the same, and the full-size probability copy is never
    made. A softmax followed by anything else (an inversion that interpolates it) is kept."""
    out = []
    for i, t in enumerate(transforms):
        following = transforms[i + 1] if i + 1 < len(transforms) else None
        if _is_softmax(t) and _is_argmax(following) and tuple(t.keys) == tuple(following.keys):
            continue
        out.append(t)
    return out


class SegmentationTask(OverlayBundleTask):
    cache_preprocessed = False

    def warm_shapes(self) -> list[tuple[int, ...]]:
        inferer = self.inferer()
        roi = getattr(inferer, "roi_size", None)
        if roi is None:
            raise ConfigError(f"{self.entry.bundle}: its inferer {type(inferer).__name__} has no roi_size; "
                              "a segmentation task needs a sliding-window inferer")
        batch = int(getattr(inferer, "sw_batch_size", 1))
        spatial = tuple(int(r) for r in ensure_tuple_rep(roi, 3))
        return [(batch, input_channels(Path(self.bundle_path)), *spatial)]

    def post_transforms(self, data=None):
        return without_softmax_before_argmax(list(super().post_transforms(data)))

    def run_inferer(self, data: Dict[str, Any], convert_to_batch=True, device="cuda"):
        network = self._get_network(device, data)
        image = data[self.input_key]
        image = image if torch.is_tensor(image) else torch.from_numpy(image)
        # MONAI stitches in the dtype of the inferer's input; the network itself gets fp32 (then autocast) from the pool.
        x = image[None].to(STITCH_DTYPES[network.settings.stitch_dtype])
        inferer = self.inferer(data)
        with network.in_use():  # every window of the study on one set of weights (a swap waits for it)
            try:
                outputs = inferer(x, network)
            except Exception as e:
                if not is_out_of_memory(e):
                    raise
                outputs = self._stitch_on_host(inferer, x, network, e)
        data[self.output_label_key] = outputs[0]
        return data

    def _stitch_on_host(self, inferer, x: torch.Tensor, network, oom: Exception) -> torch.Tensor:
        """Windows still run on the device; the blended output (and what follows) lives in host memory."""
        shape = "x".join(map(str, x.shape[2:]))
        if x.device.type == "cpu" or not hasattr(inferer, "device"):
            raise VolumeTooLarge(f"{self.entry.name}: a {shape} volume does not fit in memory: {oom}") from oom
        logger.warning("%s: %s volume does not fit on %s with on-device stitching; stitching in host memory",
                       self.entry.name, shape, x.device)
        torch.cuda.empty_cache()
        inferer.sw_device, inferer.device = x.device, torch.device("cpu")
        try:
            return inferer(x, network)
        except Exception as e:  # the blended output lives in host memory now: the CPU's allocator may refuse too
            if not is_out_of_memory(e):
                raise
            torch.cuda.empty_cache()
            raise VolumeTooLarge(f"{self.entry.name}: a {shape} volume (after resampling) does not fit on {x.device} "
                                 f"even with host stitching; free GPU memory (other models, other processes) or "
                                 f"use a larger GPU") from e
