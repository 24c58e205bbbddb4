"""A click as clients send it (voxel indices [i, j, k] of the image as stored), checked before any work is done."""

from __future__ import annotations

import math
from typing import Any, Sequence

from rocm_zoo.errors import InvalidRequest


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def voxel_point(point: Any, shape: Sequence[int], what: str) -> tuple[float, float, float]:
    """`point` as three floats when it is three finite numbers inside an image of `shape`; otherwise an
    InvalidRequest that starts with `what` (e.g. "Click [1, 2] on 'spleen'") and says what is wrong."""
    ok = isinstance(point, (list, tuple)) and len(point) == 3 and all(is_number(c) and math.isfinite(c) for c in point)
    if not ok:
        raise InvalidRequest(f"{what} is not three voxel coordinates [i, j, k]")
    if not all(0 <= c < s for c, s in zip(point, shape)):
        raise InvalidRequest(
            f"{what} is outside the image; voxel coordinates must lie in "
            f"[0, {shape[0]}) x [0, {shape[1]}) x [0, {shape[2]})"
        )
    return tuple(float(c) for c in point)
