"""What a VISTA3D request asks for, read from the two forms clients send, checked before any work is done.

OHIF v3 (model type `vista3d`) sends `points` (voxel coordinates of the stored image), `point_labels` (1 foreground,
0 background), `label_prompt` (class ids); its point tab sends the clicks with one class, its class tab the classes
alone. 3D Slicer lists only deepgrow/deepedit models for clicks; for a deepgrow model it sends `label` (the
segment's name) with `foreground` and `background` clicks. Each form becomes one `VistaPrompt`; anything the
network cannot run is an `InvalidRequest` that says why and what to send instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rocm_zoo.engine.clicks import is_number, voxel_point
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.names import did_you_mean

Point = tuple[float, float, float]


@dataclass(frozen=True)
class VistaPrompt:
    classes: tuple[int, ...] | None  # global class ids; None: the bundle's "everything" labels
    points: tuple[Point, ...] | None  # voxel coordinates of the stored image
    point_labels: tuple[int, ...] | None  # 1 foreground, 0 background (2/3 after the bundle's special-class rule)
    # Clicks only (VISTA3D's interactive point mode): no class for the class head; the point head finds the clicked
    # structure and the mask is 0/1.
    points_only: bool = False
    # The mask as 0/1 whatever the class (Slicer's deepgrow path files value 1 under the segment it asked for).
    binary: bool = False


def from_ohif(request: Mapping[str, Any], labels: Mapping[str, int], shape: Sequence[int]) -> VistaPrompt:
    """`points` / `point_labels` / `label_prompt`, as the OHIF v3 MONAI Label panel sends them."""
    points = _points(request.get("points"), "points", shape)
    point_labels = request.get("point_labels")
    if points is None:
        if point_labels not in (None, []):
            raise InvalidRequest("point_labels were sent without points; send one label per point in 'points'")
        point_labels = None
    else:
        point_labels = _point_labels(point_labels, len(points))
    classes = _classes(request.get("label_prompt"), labels)
    if points is not None and classes is not None and len(classes) > 1:
        raise InvalidRequest(
            f"Points segment one class at a time, but label_prompt has {len(classes)} classes {list(classes)}; "
            "send the points with one class, or the classes without points"
        )
    return VistaPrompt(classes, points, point_labels, points_only=points is not None and classes is None)


def from_slicer(request: Mapping[str, Any], labels: Mapping[str, int], shape: Sequence[int]) -> VistaPrompt:
    """`label` (the segment's name) with `foreground` / `background` clicks, as Slicer sends them to a deepgrow model."""
    name = request.get("label")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("Name the structure to segment in 'label' (Slicer sends the segment's name); "
                             "it must be one of the VISTA3D labels listed in /info")
    class_id = labels.get(name.lower())
    if class_id is None:
        hint = did_you_mean(name.lower(), labels, " Name the segment after a VISTA3D label, e.g. 'spleen'.")
        raise InvalidRequest(f"Unknown label '{name}' for VISTA3D.{hint} The labels are listed in /info")
    foreground = _points(request.get("foreground"), "foreground", shape) or ()
    background = _points(request.get("background"), "background", shape) or ()
    if not foreground and not background:
        raise InvalidRequest(f"No clicks for '{name}': place at least one foreground or background point")
    # With the segment's class, as OHIF's point tab sends it: the class head's answer edited by the clicks (the point
    # head alone knows "the structure clicked", not which one).
    return VistaPrompt((class_id,), foreground + background, (1,) * len(foreground) + (0,) * len(background),
                       binary=True)


def _points(value: Any, key: str, shape: Sequence[int]) -> tuple[Point, ...] | None:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return None
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest(f"'{key}' must be a list of voxel coordinates [[i, j, k], ...], not {value!r}")
    shape = [int(s) for s in shape]
    return tuple(voxel_point(p, shape, f"Point {p} in '{key}'") for p in value)


def _point_labels(value: Any, n_points: int) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest(f"{n_points} points need point_labels, one per point (1 foreground, 0 background)")
    if len(value) != n_points:
        raise InvalidRequest(f"points and point_labels differ in length ({n_points} points, {len(value)} labels); "
                             "send one label per point (1 foreground, 0 background)")
    for v in value:
        if not is_number(v) or v not in (0, 1):
            raise InvalidRequest(f"point_labels must be 1 (foreground) or 0 (background), not {v!r}")
    return tuple(int(v) for v in value)


def _classes(value: Any, labels: Mapping[str, int]) -> tuple[int, ...] | None:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return None
    values = value if isinstance(value, (list, tuple)) else [value]
    ids = sorted(set(labels.values()))
    names = {n.lower(): i for n, i in labels.items()}
    classes = []
    for v in values:
        if isinstance(v, str) and v.lower() in names:
            classes.append(names[v.lower()])
        elif isinstance(v, str) and v.strip().isdigit():
            classes.append(int(v))
        elif is_number(v) and float(v).is_integer():
            classes.append(int(v))
        else:
            raise InvalidRequest(f"label_prompt entry {v!r} is neither a VISTA3D class id nor a label name (see /info)")
    for c in classes:
        if c not in labels.values():
            raise InvalidRequest(f"Class id {c} in label_prompt is out of range: VISTA3D's classes are "
                                 f"{ids[0]}..{ids[-1]} (names and ids in /info; 0 is the background)")
    return tuple(dict.fromkeys(classes))  # repeated ids would only repeat work
