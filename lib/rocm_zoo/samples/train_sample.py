"""`rocm-zoo train-sample`: a tiny sample bundle trained on phantoms with its own train config, through the server's
training code (`TrainingRun`, the one that trains on clinicians' labels), and its best validated weights kept as the
sample's committed ones (`rocm_zoo/samples/weights/<bundle>-tiny.pt`).

The phantoms are the training specs (seeds disjoint from the test phantoms); the last two validate. What the config
itself leaves to its dataset (the datalists, MSD's folds file) comes from here, the rest is the config's: transforms,
loss, optimiser, schedule, the VISTA3D trainer's prompt sampling. Training-length keys (epochs, validation interval)
and data loading (a full cache, loader workers) are set for a GPU machine; they change how long it takes, not what
is learnt; so does the Adam learning rate of VISTA3D, wholeBody_ct and SwinUNETR, 1e-3 instead of their 1-2e-4:
upstream fine-tunes or trains for days, a sample starts from random weights and has minutes. VISTA3D learns every
phantom organ its label dictionary names, under those global class ids (upstream's continual-learning keys,
`rocm_zoo.training.vista3d_classes`), so a click and a class prompt both mean what they mean in the real model.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import math
import logging
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch

from rocm_zoo.engine.atomic_files import atomic_torch_save
from rocm_zoo.engine.overlay import OVERLAYS_DIR, overlay_path
from rocm_zoo.engine.scheduler import Priority, Work
from rocm_zoo.registry import BUNDLES
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import SAMPLE_BUNDLES, swin_unetr_btcv, training_labels, vista3d
from rocm_zoo.samples.bundles import write_sample_bundle
from rocm_zoo.training.runner import OVERLAY_FILE, TrainingRun, TrainPlan, train_config_of
from rocm_zoo.training.vista3d_classes import class_overrides

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(str(importlib.resources.files("rocm_zoo.samples") / "weights"))
VALIDATION_PHANTOMS = 2
# The GPU machine has no ITK (FACTS/DEVICE.md); the phantoms are NIfTI, which nibabel reads to the same arrays.
ITK_READERS = ("ITKReader", "monai.data.ITKReader")
# From random weights in minutes, not days (recorded with each run).
FROM_SCRATCH: dict[str, tuple[tuple[str, Any], ...]] = {
    name: (("optimizer#lr", 1e-3),)
    for name in ("vista3d", "wholeBody_ct_segmentation", "swin_unetr_btcv_segmentation")}
_VISTA3D_ORGANS = {"liver": "liver", "spleen": "spleen", "pancreas": "pancreas", "right_kidney": "right kidney",
                   "aorta": "aorta", "left_kidney": "left kidney"}


def trained_weights_file(bundle: str) -> Path:
    return WEIGHTS_DIR / f"{bundle}-tiny.pt"


def load_trained_weights(bundle: str) -> dict[str, dict[str, torch.Tensor]] | None:
    """The committed phantom-trained tiny weights, by file inside the bundle (fp32), or None where there are none.
    They are stored in fp16 (half the size in git); the bundle gets fp32, as a Model Zoo bundle ships them."""
    path = trained_weights_file(bundle)
    if not path.is_file():
        return None
    stored = torch.load(path, map_location="cpu", weights_only=True)
    return {rel: {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
            for rel, state in stored["weights"].items()}


def committed_weights(bundle: str, seed: int = 0) -> dict[str, dict[str, torch.Tensor]] | None:
    """The committed trained weights as a tiny bundle gets them: by file inside the bundle, a weights file they do not
    cover (wholeBody_ct's lowres model) seeded random. None where none are committed."""
    trained = load_trained_weights(bundle)
    if trained is None:
        return None
    module = SAMPLE_BUNDLES[bundle]
    if set(getattr(module, "WEIGHT_FILES", trained)) - set(trained):
        return {**module.random_weights("tiny", seed), **trained}
    return trained


def save_trained_weights(bundle: str, weights: dict[str, dict[str, torch.Tensor]], record: dict,
                         folder: Path | None = None) -> Path:
    """Into the package's weights (or `folder`), with the training's record."""
    path = trained_weights_file(bundle) if folder is None else Path(folder) / trained_weights_file(bundle).name
    half = {rel: {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
            for rel, state in weights.items()}
    atomic_torch_save(path, {"weights": half, "record": record})
    return path


@dataclass(frozen=True)
class SampleTraining:
    """What a bundle's sample training learns: phantom label -> the label number in its training data, and the
    config keys that say what those numbers mean."""

    labels: dict[int, int]
    meaning: tuple[tuple[str, Any], ...] = ()
    # SwinUNETR's config crops its ROI without padding (upstream's BTCV volumes are all larger): phantoms at least
    # this long in z.
    min_z_mm: float = 0.0
    # VISTA3D resamples to 1.5 mm: a whole phantom is ~10 M voxels, whose per-class crop sampling bound the run on the
    # data loader. Its studies are cut to the labelled organs and this margin around them (the 64^3 patches, 96 mm,
    # see the body around them still).
    organ_margin_mm: float | None = None

    def specs(self, count: int) -> list[phantom.PhantomSpec]:
        return [dataclasses.replace(s, shape=(*s.shape[:2], max(s.shape[2], math.ceil(self.min_z_mm / s.spacing[2]))))
                for s in phantom.training_specs(count)]


def sample_training(bundle: str) -> SampleTraining:
    if bundle == swin_unetr_btcv.NAME:
        roi = swin_unetr_btcv.ROI["tiny"] * swin_unetr_btcv.PIXDIM["tiny"][2]
        return SampleTraining(training_labels(bundle), min_z_mm=roi + 20.0)  # a slice or more to spare
    if bundle != vista3d.NAME:
        return SampleTraining(training_labels(bundle))
    ids = {name: i for i, name in vista3d.LABELS.items()}
    organs = sorted(_VISTA3D_ORGANS, key=lambda o: ids[_VISTA3D_ORGANS[o]])
    labels = {phantom.ORGAN_LABELS[o]: i + 1 for i, o in enumerate(organs)}
    global_ids = {i + 1: ids[_VISTA3D_ORGANS[o]] for i, o in enumerate(organs)}
    return SampleTraining(labels, class_overrides(global_ids), organ_margin_mm=30.0)


def write_training_data(labels: dict[int, int], folder: Path, specs: list[phantom.PhantomSpec],
                        organ_margin_mm: float | None = None) -> list[dict]:
    """The phantoms and their labels (phantom label -> `labels` number, the rest 0), as final labels would be; cut to
    the labelled organs and `organ_margin_mm` around them where given."""
    folder.mkdir(parents=True, exist_ok=True)
    data = []
    for spec in specs:
        p = phantom.make_phantom(spec)
        if organ_margin_mm is not None:
            p = _around_organs(p, list(labels), organ_margin_mm)
        image, label = folder / f"{spec.name}.nii.gz", folder / f"{spec.name}_label.nii.gz"
        if not (image.exists() and label.exists()):
            phantom.write_phantom(p, image, folder / f"{spec.name}_truth.nii.gz")
            ours = np.zeros(p.truth.shape, np.uint8)
            for value, number in labels.items():
                ours[p.truth == value] = number
            nib.save(nib.Nifti1Image(ours, p.affine), str(label))
        data.append({"image": str(image), "label": str(label)})
    return data


def _around_organs(p: phantom.Phantom, organs: list[int], margin_mm: float) -> phantom.Phantom:
    """The box holding `organs` and `margin_mm` around them, its affine moved to match."""
    where = np.argwhere(np.isin(p.truth, organs))
    margin = np.ceil(margin_mm / np.asarray(p.spec.spacing)).astype(int)
    start = np.maximum(where.min(axis=0) - margin, 0)
    stop = np.minimum(where.max(axis=0) + margin + 1, p.truth.shape)
    box = tuple(slice(a, b) for a, b in zip(start, stop))
    affine = p.affine.copy()
    affine[:3, 3] += affine[:3, :3] @ start.astype(np.float64)
    return phantom.Phantom(p.spec, np.ascontiguousarray(p.image[box]), np.ascontiguousarray(p.truth[box]), affine)


def readers_without_itk(config_file: Path) -> tuple[tuple[str, str], ...]:
    """Where ITK is not installed: the config keys that name ITKReader, set to NibabelReader."""
    try:
        import itk  # noqa: F401

        return ()
    except ImportError:
        pass
    from monai.bundle import ConfigParser

    found = []

    def walk(node, path: str) -> None:
        if isinstance(node, dict):
            if node.get("reader") in ITK_READERS:
                found.append((f"{path}#reader".lstrip("#"), "NibabelReader"))
            for k, v in node.items():
                walk(v, f"{path}#{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}#{i}")

    walk(ConfigParser.load_config_file(str(config_file)), "")
    return tuple(found)


def _loading(workers: int) -> tuple[tuple[str, Any], ...]:
    """The deterministic transforms cached once, random ones in `workers` loader processes (forked: they share the
    cache). A full cache, not one filled as it goes: workers would each fill their own copy, every epoch."""
    keys: list[tuple[str, Any]] = []
    for part in ("train", "validate"):
        keys += [(f"{part}#dataset#_target_", "CacheDataset"), (f"{part}#dataset#cache_rate", 1.0),
                 (f"{part}#dataset#num_workers", max(workers, 1)), (f"{part}#dataset#runtime_cache", False),
                 (f"{part}#dataloader#num_workers", workers if part == "train" else 0)]
    keys.append(("train#dataloader#persistent_workers", workers > 0))
    return tuple(keys)


def _committed(bundle: str, seed: int) -> tuple[dict[str, dict], dict]:
    """The committed weights to go on from, with what their record says of them (earlier resumes included)."""
    weights = committed_weights(bundle, seed)
    if weights is None:
        raise ValueError(f"No committed trained weights for {bundle} to resume from ({trained_weights_file(bundle)})")
    record = torch.load(trained_weights_file(bundle), map_location="cpu", weights_only=True)["record"]
    said = {k: record.get(k) for k in ("date", "epochs_run", "best_dice", "command", "resumed_from")}
    return weights, said


def train_sample(bundle: str, work_dir: Path, phantoms: int, epochs: int, device: str, minutes: float,
                 val_interval: int, workers: int, seed: int = 0,
                 resume: bool = False) -> tuple[dict[str, dict] | None, dict[str, Any]]:
    """Writes a tiny sample bundle in `work_dir/model` (seeded random weights, or with `resume` the committed trained
    ones), trains it on `phantoms` phantoms (the last two validate) for `epochs` or `minutes`, whichever ends first;
    returns its best validated weights (by file inside the bundle; None if none validated better than the start) and
    the run's record."""
    if bundle not in SAMPLE_BUNDLES:
        raise ValueError(f"No sample bundle '{bundle}'; there are: {', '.join(SAMPLE_BUNDLES)}")
    start_weights, resumed_from = None, None
    if resume:
        start_weights, resumed_from = _committed(bundle, seed)
    bundle_dir = write_sample_bundle(Path(work_dir) / "model", bundle, "tiny", start_weights, seed=seed)
    what = sample_training(bundle)
    data = write_training_data(what.labels, Path(work_dir) / "data" / bundle, what.specs(phantoms),
                               what.organ_margin_mm)
    config = train_config_of(bundle_dir)
    overrides = (*what.meaning, *FROM_SCRATCH.get(bundle, ()), ("val_interval", val_interval), *_loading(workers),
                 *readers_without_itk(bundle_dir / config))
    overlay = overlay_path(OVERLAYS_DIR, bundle).with_name(OVERLAY_FILE)
    weights = BUNDLES[bundle].weights
    plan = TrainPlan(bundle_dir, config, (overlay,), weights, data[:-VALIDATION_PHANTOMS],
                     data[-VALIDATION_PHANTOMS:], device, epochs, overrides=overrides)
    run = TrainingRun(plan, Work(Priority.BACKGROUND, "sample training", what=f"training {bundle}"))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    timer = threading.Timer(minutes * 60, run.finish_early)
    timer.start()
    start = time.perf_counter()
    try:
        outcome = run.run()
    finally:
        timer.cancel()
    p = run.progress
    record = {
        "bundle": bundle, "size": "tiny", "phantoms": phantoms, "validation_phantoms": VALIDATION_PHANTOMS,
        "labels": {str(k): v for k, v in what.labels.items()}, "meaning": dict(what.meaning),
        "from_scratch": dict(FROM_SCRATCH.get(bundle, ())), "resumed_from": resumed_from,
        "epochs_asked": epochs, "epochs_run": p.epoch, "iterations": len(p.iteration_ends), "minutes_max": minutes,
        "seconds": round(time.perf_counter() - start, 1), "device": device, "state": outcome.state,
        "reason": outcome.reason, "start_dice": p.baseline_dice, "best_dice": p.best_dice, "best_epoch": p.best_epoch,
        "validations": p.validations, "loss_first_last": [p.losses[0], p.losses[-1]] if p.losses else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": str(torch.__version__),
    }
    logger.info("%s: %s", bundle, json.dumps({k: record[k] for k in ("state", "reason", "epochs_run", "seconds")}))
    if not outcome.better or outcome.best_state is None:
        return None, record
    return {weights: outcome.best_state}, record
