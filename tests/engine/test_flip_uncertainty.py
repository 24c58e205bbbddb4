"""The flip-uncertainty score on synthetic softmax maps: sure and consistent ~0, torn or disagreeing ~1, and background
alone never counts."""

from __future__ import annotations

import pytest
import torch

from rocm_zoo.engine.flip_uncertainty import FLIP_AXES, FlipEnsemble, flip_axes, flip_uncertainty

SHAPE = (16, 16, 16)


def one_hot(foreground: torch.Tensor, sure: float = 1.0) -> torch.Tensor:
    """Two-class softmax map: `sure` on the foreground class inside the mask, on background outside it."""
    fg = torch.where(foreground, sure, 1 - sure)
    return torch.stack([1 - fg, fg])


def blob(lo: int, hi: int) -> torch.Tensor:
    mask = torch.zeros(SHAPE, dtype=torch.bool)
    mask[lo:hi, lo:hi, lo:hi] = True
    return mask


def test_sure_and_consistent_predictions_score_zero():
    p = one_hot(blob(4, 10))
    assert flip_uncertainty([p, p.clone(), p.clone()]) == pytest.approx(0.0, abs=1e-6)


def test_torn_predictions_score_one():
    p = torch.full((2, *SHAPE), 0.5)
    p[1, 0, 0, 0] = 0.51  # argmax needs one voxel of foreground to look at; the rest is a tie (background wins)
    p[0, 0, 0, 0] = 0.49
    assert flip_uncertainty([p]) == pytest.approx(1.0, abs=1e-3)


def test_sure_predictions_that_disagree_are_uncertain():
    # Each member is certain, but about different voxels: where one says organ the other says background.
    a, b = one_hot(blob(2, 8)), one_hot(blob(8, 14))
    assert flip_uncertainty([a, b]) == pytest.approx(1.0, abs=1e-6)
    # Half the union agreed on: the score falls between.
    c, d = one_hot(blob(2, 10)), one_hot(blob(4, 12))
    assert 0.2 < flip_uncertainty([c, d]) < 0.9


def test_more_doubt_scores_higher():
    mask = blob(4, 10)
    scores = [flip_uncertainty([one_hot(mask, sure)]) for sure in (0.99, 0.9, 0.7, 0.55)]
    assert scores == sorted(scores) and scores[0] < 0.1 < 0.9 < scores[-1]


def test_background_doubt_does_not_count():
    # Foreground sure; background everywhere else at 40 % organ (argmax background): only the foreground is scored.
    p = one_hot(blob(4, 10))
    p[1][~blob(4, 10)] = 0.4
    p[0][~blob(4, 10)] = 0.6
    assert flip_uncertainty([p]) == pytest.approx(0.0, abs=1e-6)


def test_no_foreground_scores_zero():
    p = one_hot(torch.zeros(SHAPE, dtype=torch.bool), sure=0.8)
    assert flip_uncertainty([p, p]) == 0.0


def test_normalised_by_the_number_of_classes():
    # Uniform over four classes: entropy log(4), normalised to 1.
    p = torch.full((4, *SHAPE), 0.25)
    p[1, 0, 0, 0], p[0, 0, 0, 0] = 0.26, 0.24
    assert flip_uncertainty([p]) == pytest.approx(1.0, abs=1e-3)


def test_maps_of_other_shapes_or_one_class_are_refused():
    ensemble = FlipEnsemble()
    ensemble.add(one_hot(blob(4, 10)))
    with pytest.raises(ValueError, match="cannot join"):
        ensemble.add(torch.zeros(2, 8, 8, 8))
    with pytest.raises(ValueError, match="two classes"):
        FlipEnsemble().add(torch.ones(1, *SHAPE))
    with pytest.raises(ValueError, match="no prediction"):
        FlipEnsemble().score()


def test_flips_across_left_right_come_last():
    assert len(set(FLIP_AXES)) == len(FLIP_AXES) == 7
    assert all(0 not in axes for axes in flip_axes(3))
    assert flip_axes(2) == ((1,), (2,))
    for bad in (0, 8):
        with pytest.raises(ValueError, match="1 to 7"):
            flip_axes(bad)
