"""Which final labels train which model (by the label numbers they were saved with), and the train/validation split."""

from __future__ import annotations

import pytest

from rocm_zoo.errors import InvalidRequest
from rocm_zoo.server.annotation.final_labels import Datalist, ModelLabels, fits, saved_numbers, split
from rocm_zoo.server.annotation.trainers import class_keys

DEEPEDIT = ModelLabels("spleen_deepedit", {"spleen": 1}, interactive=True)
WHOLEBODY = ModelLabels("wholeBody_ct", {"spleen": 1, "kidney_right": 2, "liver": 5}, interactive=False)
VISTA3D = ModelLabels("vista3d", {"liver": 1, "spleen": 3}, interactive=True)


def slicer(*segments) -> dict:
    return {"label_info": [{"name": n, "idx": i} for n, i in segments], "ts": 1}


def test_label_numbers_decide_the_models():
    spleen = saved_numbers(slicer(("spleen", 1), ("background", 0)))
    assert spleen == {"spleen": 1}
    assert fits(spleen, DEEPEDIT) == ""
    assert "lacks 2" in fits(spleen, WHOLEBODY)  # an automatic model needs all its organs labelled
    assert "not vista3d's numbers" in fits(spleen, VISTA3D)  # VISTA3D's spleen is 3
    assert fits(saved_numbers(slicer(("spleen", 3))), VISTA3D) == ""  # any of an interactive model's organs
    assert fits(saved_numbers(slicer(("spleen", 1), ("kidney_right", 2), ("liver", 5))), WHOLEBODY) == ""
    assert "label_info" in fits(saved_numbers({"ts": 1}), DEEPEDIT)  # saved without names: trains nothing
    assert saved_numbers({"label_info": [{"name": "x", "idx": "two"}]}) is None


def items(n: int) -> Datalist:
    return Datalist([{"image": f"i{k}", "label": f"l{k}", "id": f"s{k}"} for k in range(n)], {})


def test_split_keeps_a_label_on_each_side():
    assert split(items(2), 0.2) == ([{"image": "i0", "label": "l0"}], [{"image": "i1", "label": "l1"}])
    train, val = split(items(10), 0.2)
    assert (len(train), len(val)) == (8, 2)
    with pytest.raises(InvalidRequest, match="at least 2 final labels"):
        split(items(1), 0.2)
    with pytest.raises(InvalidRequest, match="val_split"):
        split(items(5), 0.0)


def test_vista3d_learns_the_saved_classes_under_their_global_ids():
    labels = Datalist([], {}, {"liver": 1, "spleen": 3})
    keys = dict(class_keys("vista3d", labels))
    assert keys["label_set"] == [0, 1, 3] and keys["output_classes"] == 3
    assert keys["label_mappings"] == {"default": [[1, 1], [3, 3]]}  # the values are global ids already
    assert keys["val_label_set"] == [0, 1, 3] and keys["train#random_transforms#0#num_classes"] == 4
    assert class_keys("spleen_deepedit_annotation", labels) == ()  # other bundles' numbers are their config's own
