"""VISTA3D requests in both forms (OHIF's points / point_labels / label_prompt, Slicer's label + foreground /
background), and every refusal, each saying what to send instead."""

from __future__ import annotations

import pytest

from rocm_zoo.errors import InvalidRequest
from rocm_zoo.vista3d.prompts import VistaPrompt, from_ohif, from_slicer

LABELS = {"liver": 1, "kidney": 2, "spleen": 3, "pancreas": 4}
SHAPE = (40, 30, 20)


def test_ohif_classes_alone_by_id_name_or_digit_string_deduplicated():
    p = from_ohif({"label_prompt": [3, "Liver", "2", 3.0]}, LABELS, SHAPE)
    assert p == VistaPrompt((3, 1, 2), None, None, points_only=False)
    assert from_ohif({"label_prompt": 4}, LABELS, SHAPE).classes == (4,)


def test_ohif_points_with_one_class_and_points_alone():
    p = from_ohif({"points": [[1, 2, 3], [39, 29, 19.5]], "point_labels": [1, 0], "label_prompt": [3]}, LABELS, SHAPE)
    assert p == VistaPrompt((3,), ((1.0, 2.0, 3.0), (39.0, 29.0, 19.5)), (1, 0), points_only=False)
    p = from_ohif({"points": [[5, 5, 5]], "point_labels": [1]}, LABELS, SHAPE)
    assert p.points_only and p.classes is None and p.point_labels == (1,)


def test_ohif_empty_request_is_everything():
    assert from_ohif({"points": [], "point_labels": [], "label_prompt": []}, LABELS, SHAPE) == \
        VistaPrompt(None, None, None, points_only=False)


@pytest.mark.parametrize("request_, expected", [
    ({"point_labels": [1]}, "point_labels were sent without points"),
    ({"points": [[1, 2, 3]]}, "1 points need point_labels, one per point"),
    ({"points": [[1, 2, 3]], "point_labels": 1}, "1 points need point_labels"),
    ({"points": [[1, 2, 3]], "point_labels": [1, 0]}, r"differ in length \(1 points, 2 labels\)"),
    ({"points": [[1, 2, 3]], "point_labels": [2]}, "must be 1 \\(foreground\\) or 0 \\(background\\), not 2"),
    ({"points": [[1, 2, 3]], "point_labels": ["1"]}, "not '1'"),
    ({"points": [[1, 2, 3]], "point_labels": [1], "label_prompt": [1, 2]},
     r"one class at a time, but label_prompt has 2 classes \[1, 2\]"),
    ({"points": "1,2,3", "point_labels": [1]}, "'points' must be a list of voxel coordinates"),
    ({"points": [[1, 2]], "point_labels": [1]}, r"Point \[1, 2\] in 'points' is not three voxel coordinates"),
    ({"points": [[1, 2, float("nan")]], "point_labels": [1]}, "is not three voxel coordinates"),
    ({"points": [[40, 2, 3]], "point_labels": [1]}, r"outside the image.*\[0, 40\) x \[0, 30\) x \[0, 20\)"),
    ({"points": [[-1, 2, 3]], "point_labels": [1]}, "outside the image"),
    ({"label_prompt": ["stomach"]}, "'stomach' is neither a VISTA3D class id nor a label name"),
    ({"label_prompt": [1.5]}, "1.5 is neither"),
    ({"label_prompt": [9]}, r"Class id 9 in label_prompt is out of range: VISTA3D's classes are 1..4"),
    ({"label_prompt": [0]}, "Class id 0 .* 0 is the background"),
])
def test_ohif_refusals(request_, expected):
    with pytest.raises(InvalidRequest, match=expected):
        from_ohif(request_, LABELS, SHAPE)


def test_slicer_label_with_clicks():
    p = from_slicer({"label": "Spleen", "foreground": [[1, 1, 1], [2, 2, 2]], "background": [[3, 3, 3]]}, LABELS, SHAPE)
    assert p == VistaPrompt((3,), ((1.0, 1.0, 1.0), (2.0, 2.0, 2.0), (3.0, 3.0, 3.0)), (1, 1, 0), binary=True)
    p = from_slicer({"label": "liver", "foreground": [], "background": [[3, 3, 3]]}, LABELS, SHAPE)
    assert p.classes == (1,) and p.point_labels == (0,)


@pytest.mark.parametrize("request_, expected", [
    ({"foreground": [[1, 1, 1]]}, "Name the structure to segment in 'label'"),
    ({"label": "", "foreground": [[1, 1, 1]]}, "Name the structure"),
    ({"label": 3, "foreground": [[1, 1, 1]]}, "Name the structure"),
    ({"label": "splen", "foreground": [[1, 1, 1]]}, "Unknown label 'splen' for VISTA3D. Did you mean 'spleen'?"),
    ({"label": "heart", "foreground": [[1, 1, 1]]}, "Unknown label 'heart'.*e.g. 'spleen'"),
    ({"label": "spleen"}, "No clicks for 'spleen'"),
    ({"label": "spleen", "foreground": [], "background": []}, "No clicks for 'spleen'"),
    ({"label": "spleen", "foreground": [[1, 1, 100]]}, "Point \\[1, 1, 100\\] in 'foreground' is outside the image"),
    ({"label": "spleen", "background": [[1, "a", 1]]}, "in 'background' is not three voxel coordinates"),
])
def test_slicer_refusals(request_, expected):
    with pytest.raises(InvalidRequest, match=expected):
        from_slicer(request_, LABELS, SHAPE)
