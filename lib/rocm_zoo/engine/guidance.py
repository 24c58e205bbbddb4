"""DeepEdit guidance channels computed where the image is (GPU or CPU).

Same result as MONAI's `AddGuidanceSignalDeepEditd` (one channel per label: the clicks as single voxels,
Gaussian-smoothed with sigma 3, min-max scaled to 0..1; an all-zero channel for a label without clicks), but built
with torch on the image's device instead of numpy on the host, so a click does not copy the volume off the GPU.
"""

from __future__ import annotations

import torch
from monai.data import MetaTensor
from monai.networks.layers import GaussianFilter
from monai.transforms import MapTransform


def guidance_signal(spatial: tuple[int, ...], points: list, sigma: float, device: torch.device) -> torch.Tensor:
    signal = torch.zeros((1, *spatial), dtype=torch.float32, device=device)
    # MONAI's transform ignores points with a negative coordinate and clamps the rest into the volume.
    kept = [p for p in points if min(p) >= 0]
    if not kept:
        return signal
    idx = torch.tensor([[int(c) for c in p[-3:]] for p in kept], device=device)
    idx = torch.minimum(idx, torch.tensor(spatial, device=device) - 1)
    signal[0, idx[:, 0], idx[:, 1], idx[:, 2]] = 1.0
    smoothed = GaussianFilter(3, sigma=sigma).to(device)(signal[None])[0]
    low, high = smoothed.min(), smoothed.max()
    return (smoothed - low) / (high - low)


class DeviceGuidanceSignald(MapTransform):
    """Drop-in for `AddGuidanceSignalDeepEditd` (3D, image key only) that keeps the data on its device."""

    def __init__(self, keys, guidance: str = "guidance", sigma: int = 3, number_intensity_ch: int = 1, **_):
        super().__init__(keys)
        self.guidance = guidance
        self.sigma = sigma
        self.number_intensity_ch = number_intensity_ch

    @classmethod
    def replacing(cls, upstream) -> DeviceGuidanceSignald:
        return cls(upstream.keys, upstream.guidance, upstream.sigma, upstream.number_intensity_ch)

    def __call__(self, data):
        d = dict(data)
        for key in self.key_iterator(d):
            image = d[key]
            spatial = tuple(image.shape[-3:])
            channels = [torch.as_tensor(image[: self.number_intensity_ch])]
            for points in d[self.guidance].values():
                channels.append(guidance_signal(spatial, list(points), self.sigma, image.device))
            stacked = torch.cat([c.as_tensor() if isinstance(c, MetaTensor) else c for c in channels])
            if isinstance(image, MetaTensor):
                image.array = stacked  # keeps meta and applied operations, as the upstream transform does
            else:
                d[key] = stacked
        return d
