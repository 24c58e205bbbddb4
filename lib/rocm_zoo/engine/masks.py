"""Small mask helpers shared by the benchmarks, the click scripts and the tests (numpy only)."""

from __future__ import annotations

import numpy as np


def central_voxel(mask: np.ndarray) -> list[int]:
    """The mask voxel nearest the mask's centroid: an annotator's click in the middle of the organ."""
    pts = np.argwhere(mask)
    return pts[np.argmin(((pts - pts.mean(0)) ** 2).sum(1))].tolist()


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice of two boolean masks; 0 when both are empty."""
    return float(2 * (a & b).sum() / max(1, a.sum() + b.sum()))
