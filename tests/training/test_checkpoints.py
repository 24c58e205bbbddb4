"""Accepted checkpoints are kept, the newest served; the shipped weights are kept first; a rollback serves a kept one
again and is recorded; a crash while serving leaves the weights file old or new and the index saying which."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import torch
from torch import nn

from rocm_zoo.errors import CheckpointNotFound, InvalidRequest
from rocm_zoo.training import checkpoints
from rocm_zoo.training.checkpoints import CheckpointStore, TrainingDetails

DETAILS = TrainingDetails(measured_on="2 validation images (labels/final)", epochs=5, labels=8)


def weights_of(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return nn.Conv3d(1, 2, 1).state_dict()


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "toy_bundle"
    (root / "models").mkdir(parents=True)
    torch.save(weights_of(0), root / "models" / "model.pt")
    return root


def served_file(bundle) -> dict:
    return torch.load(bundle / "models" / "model.pt", weights_only=True)


def test_accept_keeps_the_shipped_weights_then_serves_each_new_checkpoint(bundle):
    shipped_bytes = (bundle / "models" / "model.pt").read_bytes()
    store = CheckpointStore(bundle)
    assert store.list() == [] and store.served() is None and store.served_score() is None

    first = store.accept(weights_of(1), 0.81, DETAILS)
    second = store.accept(weights_of(2), 0.86, DETAILS)
    assert [(c.id, c.source) for c in store.list()] == [("shipped", "shipped"), ("1", "training"),
                                                        ("2", "training")]
    assert store.served() == second and store.served_score() == 0.86
    assert (first.score, first.measured_on, first.epochs, first.labels) == (0.81, DETAILS.measured_on, 5, 8)
    assert datetime.fromisoformat(second.created).utcoffset() == timezone.utc.utcoffset(None)
    assert same(served_file(bundle), weights_of(2))
    assert (store.path(store.list()[0])).read_bytes() == shipped_bytes  # copied, byte for byte
    assert same(torch.load(store.path(first), weights_only=True), weights_of(1))

    index = json.loads((bundle / "models" / "checkpoints" / "index.json").read_text())
    assert index["served"] == "2" and index["serving"] is None
    assert [c["id"] for c in index["checkpoints"]] == ["shipped", "1", "2"]
    assert CheckpointStore(bundle).served() == second  # a new reader (another process) sees the same


def test_a_wrapped_weights_file_stays_wrapped(bundle):
    torch.save({"model": weights_of(0)}, bundle / "models" / "model.pt")
    store = CheckpointStore(bundle)
    checkpoint = store.accept({"model": weights_of(1)}, 0.7, DETAILS)
    assert set(served_file(bundle)) == {"model"} and same(served_file(bundle)["model"], weights_of(1))
    assert set(torch.load(store.path(checkpoint), weights_only=True)) == {"model"}


def test_rollback_serves_a_kept_checkpoint_again_and_records_it(bundle):
    store = CheckpointStore(bundle)
    store.accept(weights_of(1), 0.81, DETAILS)
    store.accept(weights_of(2), 0.74, DETAILS)
    back = store.rollback("1")
    assert (back.id, back.source, back.rollback_of, back.score, back.file) == ("3", "rollback", "1", 0.81, "1.pt")
    assert store.served() == back and store.served_score() == 0.81
    assert same(served_file(bundle), weights_of(1))

    store.rollback("shipped")
    assert same(served_file(bundle), weights_of(0))
    assert store.served().rollback_of == "shipped" and store.served_score() is None  # never measured here
    assert [c.id for c in store.list()] == ["shipped", "1", "2", "3", "4"]


def test_an_unknown_checkpoint_is_a_clear_error(bundle):
    store = CheckpointStore(bundle)
    with pytest.raises(CheckpointNotFound, match="toy_bundle has no checkpoint '1'; kept: none"):
        store.rollback("1")
    store.accept(weights_of(1), 0.8, DETAILS)
    with pytest.raises(CheckpointNotFound, match="no checkpoint '9'; kept: shipped, 1"):
        store.rollback("9")
    assert store.served().id == "1"


def test_weights_that_do_not_fit_the_bundle_are_refused_before_anything_is_written(bundle):
    store = CheckpointStore(bundle)
    with pytest.raises(InvalidRequest, match="missing keys bias"):
        store.accept({"weight": weights_of(1)["weight"]}, 0.9, DETAILS)
    assert not (bundle / "models" / "checkpoints").exists()
    assert same(served_file(bundle), weights_of(0))


def test_a_crash_after_the_weights_file_is_replaced_leaves_an_index_that_says_so(bundle, monkeypatch):
    store = CheckpointStore(bundle)
    store.accept(weights_of(1), 0.81, DETAILS)
    write_index = CheckpointStore._write_index
    calls = []

    def crash_on_the_last_index_write(self, served_id, entries, serving=None):
        calls.append(serving)
        if serving is None:
            raise KeyboardInterrupt("power cut")
        write_index(self, served_id, entries, serving)

    monkeypatch.setattr(CheckpointStore, "_write_index", crash_on_the_last_index_write)
    with pytest.raises(KeyboardInterrupt):
        store.accept(weights_of(2), 0.86, DETAILS)
    monkeypatch.undo()
    assert calls == ["2", None]

    after = CheckpointStore(bundle)  # the next process
    assert same(served_file(bundle), weights_of(2))
    assert after.served().id == "2" and after.served_score() == 0.86
    assert after.accept(weights_of(3), 0.9, DETAILS).id == "3"
    assert [c.id for c in after.list()] == ["shipped", "1", "2", "3"]


def test_a_crash_before_the_weights_file_is_replaced_leaves_the_old_weights_served(bundle, monkeypatch):
    store = CheckpointStore(bundle)
    store.accept(weights_of(1), 0.81, DETAILS)
    copy = checkpoints.atomic_copy

    def crash_serving(src, dest):
        if dest == store.weights:
            raise KeyboardInterrupt("power cut")
        copy(src, dest)

    monkeypatch.setattr(checkpoints, "atomic_copy", crash_serving)
    with pytest.raises(KeyboardInterrupt):
        store.accept(weights_of(2), 0.86, DETAILS)
    monkeypatch.undo()

    after = CheckpointStore(bundle)
    assert same(served_file(bundle), weights_of(1))
    assert after.served().id == "1"
    assert [c.id for c in after.list()] == ["shipped", "1"]  # the checkpoint never served is not kept
    assert after.accept(weights_of(2), 0.86, DETAILS).id == "2"
    assert same(served_file(bundle), weights_of(2))


def test_weights_replaced_from_outside_are_kept_before_the_next_accept(bundle):
    store = CheckpointStore(bundle)
    store.accept(weights_of(1), 0.81, DETAILS)
    torch.save(weights_of(5), bundle / "models" / "model.pt")  # e.g. the bundle downloaded again
    assert store.served() is None and store.served_score() is None
    store.accept(weights_of(2), 0.86, DETAILS)
    assert [(c.id, c.source) for c in store.list()] == [("shipped", "shipped"), ("1", "training"),
                                                        ("shipped-2", "shipped"), ("2", "training")]
    assert same(torch.load(store.path(store.list()[2]), weights_only=True), weights_of(5))
