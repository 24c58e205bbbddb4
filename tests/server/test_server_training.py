"""The annotation loop through HTTP, as Slicer and OHIF drive it: clinicians save final labels, press Train (Slicer:
`POST /train/{model}`) or Update Model (OHIF: `POST /train/`), watch the progress in `/info` -> `train_stats`, and the
next click comes from the new weights, without a restart and without a recompile.

A server of its own, on a DeepEdit sample bundle whose weights were trained only briefly elsewhere (the sample training,
a few dozen steps on other phantoms): three phantoms' final labels fine-tune it with the bundle's own train config, a
fourth phantom it never saw measures the click before and after.
"""

from __future__ import annotations

import io
import json
import tempfile
import time

import nibabel as nib
import numpy as np
import pytest
import requests
import SimpleITK as sitk
from monailabel.client import MONAILabelClient

from rocm_zoo.app.app_folder import make_app_folder
from rocm_zoo.cli import main as cli
from rocm_zoo.engine.masks import central_voxel, dice
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import write_sample_bundle
from rocm_zoo.samples.deepedit_weights import train_deepedit
from rocm_zoo.server.audit.trail import AuditTrail, trail_path
from zoo_test_support import monailabel_server

pytestmark = pytest.mark.slow

MODEL, BUNDLE = "spleen_deepedit", "spleen_deepedit_annotation"
SPLEEN = phantom.ORGAN_LABELS["spleen"]
LABELLED = [s.name for s in phantom.training_specs(3)]
HELD_OUT = phantom.test_specs(1)[0]
# The training is not seeded. With 20 epochs the held-out click gained +0.01 to +0.08 Dice over four runs (one below
# the +0.02 asserted); with 30, +0.13 and +0.18 in two runs (2026-12-05).
EPOCHS = 30
START_STEPS = 30  # the shipped bundle's training (the committed sample weights had 1,000)
SLICER_LABEL_INFO = {"label_info": [{"name": "spleen", "idx": 1}, {"name": "background", "idx": 0}]}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("training")
    app_dir, studies = root / "app", root / "studies"
    make_app_folder(app_dir)
    bundle = write_sample_bundle(app_dir / "model", BUNDLE, "tiny")
    write_sample_bundle(app_dir / "model", BUNDLE, "tiny",
                        weights={"models/model.pt": train_deepedit(bundle, steps=START_STEPS, phantoms=8, seed=5)})
    studies.mkdir()
    truths = {}
    for spec in phantom.training_specs(3) + [HELD_OUT]:
        p = phantom.make_phantom(spec)
        phantom.write_phantom(p, studies / f"{spec.name}.nii.gz", root / f"{spec.name}_truth.nii.gz")
        truths[spec.name] = (p.truth == SPLEEN, p.affine)
    with monailabel_server(app_dir, str(studies), MODEL, root / "server.log", cwd=root, timeout_s=900,
                           env={"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}) as url:
        yield url, app_dir / "model", truths


def save_final_label(url: str, image_id: str, mask: np.ndarray, affine: np.ndarray) -> None:
    """What Slicer's Submit Label sends: the label file, tag final, and each segment's name and number."""
    buf = io.BytesIO(nib.Nifti1Image(mask.astype(np.uint8), affine).to_bytes())
    r = requests.put(f"{url}/datastore/label", params={"image": image_id, "tag": "final"},
                     files={"label": ("label.nii.gz", buf.getvalue()), "params": (None, json.dumps(SLICER_LABEL_INFO))},
                     timeout=60)
    assert r.status_code == 200, r.text


def click_dice(url: str, image_id: str, truth: np.ndarray) -> tuple[float, float]:
    """One Slicer click at the spleen's centre: the mask's Dice against the truth, and the click's time."""
    params = {"result_extension": ".nrrd", "result_dtype": "uint8", "client_id": "annotator", "label": "spleen",
              "spleen": [central_voxel(truth)], "background": []}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmpdir:
        result, _ = MONAILabelClient(url, tmpdir=tmpdir).infer(MODEL, image_id, params)
        seconds = time.perf_counter() - start
        labels = sitk.GetArrayFromImage(sitk.ReadImage(result)).transpose(2, 1, 0)
    return dice(labels == 1, truth), seconds


def info(url: str) -> dict:
    return requests.get(f"{url}/info/", timeout=10).json()


def wait_done(url: str, timeout_s: float = 1200) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        record = requests.get(f"{url}/train/", timeout=10).json()
        if record["status"] not in ("QUEUED", "RUNNING"):
            return record
        time.sleep(2)
    pytest.fail(f"the training did not end in {timeout_s} s: {record}")


def test_labels_train_the_served_model_in_place(site, capsys):
    url, model_dir, truths = site
    assert MODEL in info(url)["trainers"]
    assert requests.get(f"{url}/train/", params={"check_if_running": "true"}, timeout=10).status_code == 404
    r = requests.post(f"{url}/train/", timeout=30)  # OHIF's Update Model before anyone saved a label
    assert r.status_code == 422 and "at least 2 final labels" in r.text, r.text

    for image_id in LABELLED:
        save_final_label(url, image_id, *truths[image_id])
    before, alone_s = click_dice(url, HELD_OUT.name, truths[HELD_OUT.name][0])
    graphs = info(url)["models"][MODEL]["compiled_graphs"]

    r = requests.post(f"{url}/train/{MODEL}", json={"max_epochs": EPOCHS, "val_split": 0.34}, timeout=30)
    assert r.status_code == 200, r.text
    again = requests.post(f"{url}/train/{MODEL}", json={"max_epochs": 1}, timeout=30)
    assert again.status_code == 429 and "already running" in again.text, again.text
    assert requests.get(f"{url}/train/", params={"check_if_running": "true"}, timeout=10).status_code == 200

    # While it trains: the viewers' progress moves, and clicks are served between its iterations.
    epochs_seen, clicks_s = set(), []
    while requests.get(f"{url}/train/", timeout=10).json()["status"] == "RUNNING":
        stats = info(url)["train_stats"][MODEL]
        epochs_seen.add(stats.get("epoch"))
        assert stats["total_epochs"] == EPOCHS
        if stats.get("state") == "training" and len(clicks_s) < 3:
            clicks_s.append(click_dice(url, HELD_OUT.name, truths[HELD_OUT.name][0])[1])
        time.sleep(1)
    record = wait_done(url)
    assert record["status"] == "DONE" and record["result"]["published"], record
    assert {0, EPOCHS} <= epochs_seen or len(epochs_seen) >= 2, epochs_seen
    stats = info(url)["train_stats"][MODEL]
    assert stats["best_metric"] > stats["baseline_metric"], stats
    # A click waits for at most one training iteration (a few seconds on two CPU cores), never for the training.
    assert clicks_s and max(clicks_s) < alone_s + 15, (clicks_s, alone_s)

    after, _ = click_dice(url, HELD_OUT.name, truths[HELD_OUT.name][0])
    print(f"held-out click Dice {before:.3f} -> {after:.3f} after {EPOCHS} epochs on {len(LABELLED)} labels; "
          f"validation {stats['baseline_metric']:.3f} -> {stats['best_metric']:.3f}; clicks during training "
          f"{[round(c, 2) for c in clicks_s]} s, alone {alone_s:.2f} s")
    assert after >= before + 0.02, (before, after)
    assert info(url)["models"][MODEL]["compiled_graphs"] == graphs, "the new weights were compiled again"

    assert cli(["models", "list", BUNDLE, "--model-dir", str(model_dir)]) == 0
    listing = capsys.readouterr().out
    assert record["result"]["checkpoint"] in listing and "shipped" in listing, listing

    r = requests.post(f"{url}/train/", timeout=30)  # nothing changed since: nothing to train
    assert r.status_code == 422 and "did not change" in r.text, r.text

    # the audit trail (issue 34): the request, the refused second one, the end, the swap
    trail = {e["event"]: e for e in AuditTrail(trail_path(model_dir.parent)).entries(event="training")}
    assert trail["training.finished"]["details"]["better"] is True
    assert sorted(trail["training.finished"]["details"]["labels"]) == sorted(LABELLED)
    started = [e["details"] for e in AuditTrail(trail_path(model_dir.parent)).entries(event="training.started")]
    assert {(d.get("model"), d["status"]) for d in started} >= {(MODEL, 200), (MODEL, 429), (None, 422)}, started
    swapped = list(AuditTrail(trail_path(model_dir.parent)).entries(event="weights.swapped"))
    assert swapped[-1]["details"]["checkpoint"] == record["result"]["checkpoint"]
    assert AuditTrail(trail_path(model_dir.parent)).verify().intact


def test_a_stopped_training_leaves_the_served_weights(site):
    url, model_dir, truths = site
    served = model_dir / BUNDLE / "models" / "model.pt"
    before = served.read_bytes()
    held_out, affine = truths[HELD_OUT.name]
    save_final_label(url, HELD_OUT.name, held_out, affine)  # a new label: Update Model has something to train
    r = requests.post(f"{url}/train/", json={"max_epochs": 50}, timeout=30)
    assert r.status_code == 200 and r.json()["started"][0]["model"] == MODEL, r.text
    time.sleep(3)
    stopped = requests.delete(f"{url}/train/", timeout=30)
    assert stopped.status_code == 200, stopped.text
    record = wait_done(url, timeout_s=300)
    assert record["status"] == "STOPPED" and not record["result"]["published"], record
    assert served.read_bytes() == before
    stops = list(AuditTrail(trail_path(model_dir.parent)).entries(event="training.stopped"))
    assert stops and stops[-1]["details"]["status"] == 200
