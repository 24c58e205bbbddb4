"""A real training of the tiny DeepEdit sample on CPU through `TrainingRun` (its own train config and the training
overlay, phantoms with spleen labels): device work in background turns, the served weights validated first, the best
weights kept on the host; and a stopped training ends at its next turn with nothing to publish."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from rocm_zoo.engine.overlay import OVERLAYS_DIR
from rocm_zoo.engine.scheduler import Priority, Work, device_queue
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import training_labels, write_sample_bundle
from rocm_zoo.samples.train_sample import write_training_data
from rocm_zoo.training.runner import OVERLAY_FILE, TrainingRun, TrainPlan, train_config_of

BUNDLE = "spleen_deepedit_annotation"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("train")
    data = write_training_data(training_labels(BUNDLE), root / "data", phantom.training_specs(3))
    return write_sample_bundle(root / "model", BUNDLE, "tiny"), data


def plan(bundle: Path, data: list[dict], epochs: int) -> TrainPlan:
    return TrainPlan(bundle, train_config_of(bundle), (OVERLAYS_DIR / BUNDLE / OVERLAY_FILE,), "models/model.pt",
                     data[:2], data[2:], "cpu", epochs)


def test_a_training_takes_background_turns_and_keeps_the_best_weights(site):
    bundle, data = site
    served = torch.load(bundle / "models" / "model.pt", weights_only=True)
    turns = device_queue("cpu").info()["background"]["served"]
    run = TrainingRun(plan(bundle, data, 2), Work(Priority.BACKGROUND, "test", what="training"))
    outcome = run.run()
    p = run.progress
    assert outcome.state == "done" and p.epoch == 2 and len(p.losses) == 4, outcome.reason
    assert p.iteration == p.total_iterations == 2 and p.end_ts is not None
    assert p.baseline_dice is not None and p.best_dice is not None and p.samples_per_iteration == 1
    # one turn per training step at least, plus the validation forwards and DeepEdit's simulated clicks
    assert device_queue("cpu").info()["background"]["served"] - turns >= 4 + 3
    if outcome.better:
        assert set(outcome.best_state) == set(served)
        assert any(not torch.equal(outcome.best_state[k], served[k]) for k in served)
    else:
        assert outcome.best_state is None and "kept" in outcome.reason
    # the served weights file is the caller's to change, never the run's
    assert all(torch.equal(v, served[k]) for k, v in torch.load(bundle / "models" / "model.pt",
                                                                weights_only=True).items())


def test_a_stopped_training_ends_at_its_next_turn(site):
    bundle, data = site
    run = TrainingRun(plan(bundle, data, 50), Work(Priority.BACKGROUND, "test", what="training"))

    def stop_in_the_second_epoch():  # two training labels: iterations 1-2 are the first epoch
        deadline = time.time() + 300
        while len(run.progress.iteration_ends) < 3 and time.time() < deadline:
            time.sleep(0.05)
        run.stop()

    threading.Thread(target=stop_in_the_second_epoch, daemon=True).start()
    outcome = run.run()
    assert outcome.state == "stopped" and not outcome.better and outcome.best_state is None
    assert run.progress.epoch < 50
    # What the viewers read after the stop: the run's time stands still and no count runs past its total.
    stats = run.progress.as_stats()
    assert stats["state"] == "stopped" and "current_time" not in stats
    assert stats["epoch"] >= 1 and 0 < stats["iteration"] <= stats["total_iterations"] == 2, stats
    time.sleep(1.1)
    assert run.progress.as_stats()["total_time"] == stats["total_time"]


def test_without_validation_labels_nothing_runs(site):
    bundle, data = site
    outcome = TrainingRun(TrainPlan(bundle, train_config_of(bundle), (), "models/model.pt", data, [], "cpu", 1),
                          Work(Priority.BACKGROUND, "test")).run()
    assert outcome.state == "failed" and "at least one to validate on" in outcome.reason, outcome.reason
