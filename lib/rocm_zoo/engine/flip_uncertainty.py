"""How unsure a segmentation network is about a volume, from its predictions on the volume and on flips of it.

The network segments the volume as it is and mirrored along one or more axes; each mirrored prediction is flipped
back, so all of them describe the same voxels. Their softmax maps are averaged, and the score is the entropy of that
average, divided by log(classes) so it lies in [0, 1], averaged over the foreground: the voxels that at least one of
the predictions gives to a class other than 0 (background). Where the network is sure and consistent the average is
nearly one-hot (entropy ~0); where it hesitates, or where the flips disagree, it spreads over classes. Background
alone is left out, or the empty air around every body, which any model is sure of, would dilute every score to ~0.
A volume in which no prediction finds any foreground scores 0.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

# Spatial axes each flip mirrors, in the order they are used. Bundles orient volumes RAS, so axis 0 is left-right;
# flips across it come last: label sets name left and right organs (kidney_left ...), and a network that learnt which
# side is which (the phantom-trained DeepEdit sample scores ~0.99 on every phantom with it, ~0.6 with the other two)
# then measures the mirrored anatomy, not its doubt about this volume.
FLIP_AXES: tuple[tuple[int, ...], ...] = ((1,), (2,), (1, 2), (0,), (0, 1), (0, 2), (0, 1, 2))


def flip_axes(flips: int) -> tuple[tuple[int, ...], ...]:
    """The spatial axes of each of the first `flips` flips (1 to 7)."""
    if not 1 <= flips <= len(FLIP_AXES):
        raise ValueError(f"flips must be 1 to {len(FLIP_AXES)}, not {flips}")
    return FLIP_AXES[:flips]


class FlipEnsemble:
    """The running mean of softmax maps (classes first: C x spatial) and the union of their foreground, so a volume's
    predictions need not all be held at once."""

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None
        self._foreground: torch.Tensor | None = None
        self.members = 0

    def add(self, probabilities: torch.Tensor) -> None:
        if probabilities.ndim < 2 or probabilities.shape[0] < 2:
            raise ValueError(f"softmax maps need two classes or more, first: got shape {tuple(probabilities.shape)}")
        p = probabilities.float()
        if self._sum is None:
            self._sum = p.clone()
            self._foreground = p.argmax(0) != 0
        else:
            if p.shape != self._sum.shape:
                raise ValueError(f"a map of shape {tuple(p.shape)} cannot join maps of {tuple(self._sum.shape)}")
            self._sum += p
            self._foreground |= p.argmax(0) != 0
        self.members += 1

    def score(self) -> float:
        """Mean normalised entropy of the averaged map over the foreground; 0 when there is none."""
        if self._sum is None:
            raise ValueError("no prediction was added")
        if not bool(self._foreground.any()):
            return 0.0
        mean = self._sum[:, self._foreground] / self.members  # C x foreground voxels
        entropy = -(mean * torch.log(mean.clamp_min(1e-12))).sum(0)
        return float(entropy.mean() / math.log(mean.shape[0]))


def flip_uncertainty(probability_maps: Iterable[torch.Tensor]) -> float:
    """The score of softmax maps (already flipped back), each C x spatial."""
    ensemble = FlipEnsemble()
    for p in probability_maps:
        ensemble.add(p)
    return ensemble.score()
