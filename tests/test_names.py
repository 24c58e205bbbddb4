"""The one near-miss hint (rocm_zoo.names.did_you_mean), word for word as the errors that use it have always read."""

from __future__ import annotations

import pytest

from rocm_zoo.errors import ConfigError
from rocm_zoo.names import did_you_mean
from rocm_zoo.registry import select_models


def test_the_closest_known_name_is_suggested_with_its_leading_space():
    assert did_you_mean("spleen_deepedt", ["spleen_deepedit", "vista3d"]) == " Did you mean 'spleen_deepedit'?"
    assert did_you_mean("amp_dtyp", ("compile", "amp_dtype")) == " Did you mean 'amp_dtype'?"


def test_nothing_close_gives_the_fallback():
    assert did_you_mean("zzzz", ["spleen_deepedit", "vista3d"]) == ""
    assert did_you_mean("zzzz", ["spleen"], " Name it.") == " Name it."
    assert did_you_mean("anything", []) == ""


def test_any_iterable_of_names_works_a_mapping_by_its_keys():
    assert did_you_mean("splen", {"spleen": 1, "liver": 5}) == " Did you mean 'spleen'?"
    assert did_you_mean("livr", (n for n in ["spleen", "liver"])) == " Did you mean 'liver'?"


def test_an_error_message_reads_as_before():
    with pytest.raises(ConfigError) as exc:
        select_models("vista3e")
    assert str(exc.value).startswith("Unknown model 'vista3e' in --conf models. Did you mean 'vista3d'? Known models: ")


def test_the_vista3d_label_hint_and_its_fallback_read_as_before():
    from rocm_zoo.errors import InvalidRequest
    from rocm_zoo.vista3d.prompts import from_slicer

    labels = {"spleen": 3, "liver": 1}
    with pytest.raises(InvalidRequest) as exc:
        from_slicer({"label": "Splen", "foreground": [[1, 1, 1]]}, labels, (8, 8, 8))
    assert str(exc.value) == "Unknown label 'Splen' for VISTA3D. Did you mean 'spleen'? The labels are listed in /info"
    with pytest.raises(InvalidRequest) as exc:
        from_slicer({"label": "qqq", "foreground": [[1, 1, 1]]}, labels, (8, 8, 8))
    assert str(exc.value) == ("Unknown label 'qqq' for VISTA3D. Name the segment after a VISTA3D label, e.g. "
                              "'spleen'. The labels are listed in /info")
