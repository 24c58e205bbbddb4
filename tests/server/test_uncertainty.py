"""The uncertainty strategy with a stand-in task (no bundle): predictions flipped back onto the image, scores cached per
image and weights, a bounded number of new studies per call, batch priority, and studies that cannot be scored."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from rocm_zoo.engine.scheduler import Priority, current_work
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.server.annotation.uncertainty import UncertaintyStrategy, flip_score

SHAPE = (12, 10, 8)


def volume(value: float) -> torch.Tensor:
    """One channel, an off-centre block of `value` (so every flip moves it): the stand-in's organ."""
    x = torch.zeros(1, *SHAPE)
    x[0, 1:5, 2:5, 1:3] = value
    return x


class StandInTask:
    """Segments voxel by voxel (logit = 10 x intensity): equivariant to flips, so flipped back its predictions agree.
    A block at 1.0 is organ for sure; at 0.05 the organ's probability is ~0.6."""

    input_key, output_label_key, device = "image", "pred", "cpu"

    def __init__(self, weights, volumes: dict[str, torch.Tensor]):
        self._config = {"device": "cpu"}
        self.entry = SimpleNamespace(name="stand_in_seg")
        self.weights = weights
        self.volumes = volumes
        self.runs: list[tuple[str, Priority]] = []

    def network_spec(self):
        return SimpleNamespace(bundle_dir=self.weights.parent, weights=self.weights.name)

    def pre_transforms(self, data):
        return []

    def run_pre_transforms(self, data, transforms):
        if data["image"] not in self.volumes:
            raise InvalidRequest(f"Image '{data['image']}' cannot be read")
        return {**data, "image": self.volumes[data["image"]].clone(), "study": data["image"]}

    def run_inferer(self, data, device="cpu"):
        self.runs.append((data["study"], current_work().priority))
        x = data["image"]
        return {**data, "pred": torch.cat([torch.zeros_like(x), 10 * x - 0.1])}


class Store:
    """The datastore calls a strategy makes: unlabelled ids (no 'final') and their paths (here: the ids)."""

    def __init__(self, images):
        self.images = list(images)
        self.final: set[str] = set()

    def get_unlabeled_images(self, label_tag=None, labels=None):
        return [i for i in self.images if i not in self.final]

    def get_image_uri(self, image):
        return image


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"weights")
    return path


def test_predictions_are_flipped_back_onto_the_image(weights):
    task = StandInTask(weights, {"sure": volume(1.0), "doubtful": volume(0.05)})
    # Every flip moves the block; only flipped back do the three predictions agree (a missed flip-back scores ~1).
    assert flip_score(task, "sure", flips=3) == pytest.approx(0.0, abs=1e-3)
    assert flip_score(task, "doubtful", flips=2) > 0.9
    assert len(task.runs) == 4 + 3  # (flips + 1) network runs per study


def test_ranks_the_most_uncertain_unlabelled_study_and_caches_scores(weights):
    task = StandInTask(weights, {"a_sure": volume(1.0), "b_doubtful": volume(0.05), "c_sure": volume(0.9)})
    store = Store(task.volumes)
    strategy = UncertaintyStrategy(task, flips=2, max_new=8)
    answer = strategy({"strategy": "uncertainty"}, store)
    assert answer["id"] == "b_doubtful" and answer["score"] > 0.9
    assert (answer["scored"], answer["unscored"], answer["failed"]) == (3, 0, 0)
    assert answer["model"] == "stand_in_seg" and answer["flips"] == 2
    assert all(priority == Priority.BATCH for _, priority in task.runs)
    runs = len(task.runs)
    assert runs == 3 * 3

    # Annotated ('final'): the next one, from the cached scores (no network run).
    store.final.add("b_doubtful")
    assert strategy({"strategy": "uncertainty"}, store)["id"] in ("a_sure", "c_sure")
    assert len(task.runs) == runs

    # New weights: every study is scored again.
    os.utime(weights, (1, 1))
    strategy({"strategy": "uncertainty"}, store)
    assert len(task.runs) == runs + 2 * 3

    store.final |= {"a_sure", "c_sure"}
    assert strategy({"strategy": "uncertainty"}, store) is None  # nothing left to annotate: MONAI Label's {}


def test_a_call_scores_at_most_max_new_studies(weights):
    task = StandInTask(weights, {"a_sure": volume(1.0), "b_sure": volume(0.9), "c_doubtful": volume(0.05)})
    strategy = UncertaintyStrategy(task, flips=1, max_new=2)
    store = Store(task.volumes)
    first = strategy({}, store)
    assert (first["scored"], first["unscored"]) == (2, 1) and first["id"] in ("a_sure", "b_sure")
    second = strategy({}, store)
    assert (second["id"], second["scored"], second["unscored"]) == ("c_doubtful", 3, 0)
    assert len(task.runs) == 3 * 2
    assert "at most 2 new studies" in strategy.info()["description"]


def test_a_study_that_cannot_be_scored_is_counted_and_the_rest_ranked(weights):
    task = StandInTask(weights, {"a_sure": volume(1.0)})
    strategy = UncertaintyStrategy(task, flips=1, max_new=8)
    answer = strategy({}, Store(["a_sure", "broken"]))
    assert (answer["id"], answer["scored"], answer["failed"]) == ("a_sure", 1, 1)
    with pytest.raises(InvalidRequest, match="broken.*cannot be read"):
        strategy({}, Store(["broken"]))


def test_waits_while_requests_run(weights):
    task = StandInTask(weights, {"a_sure": volume(1.0)})
    busy = iter([True, True, False])
    polls = []

    def requests_running() -> bool:
        polls.append(1)
        return next(busy, False)

    UncertaintyStrategy(task, flips=1, max_new=8, requests_running=requests_running)({}, Store(["a_sure"]))
    assert len(polls) == 3 and len(task.runs) == 2
