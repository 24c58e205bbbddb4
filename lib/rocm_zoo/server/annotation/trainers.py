"""The annotation loop in the server: one MONAI Label train task per served bundle that ships a train config, trainings
from the datastore's final labels, and what happens to a training that beats the served weights.

A train task is what `/info` lists under `trainers` (with the options Slicer shows) and `train_stats` (the progress
both viewers draw). Trainings run in the server process, through `TrainingService`, at the scheduler's lowest class on
the serving device, or on `--conf train_device`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from monailabel.interfaces.tasks.train import TrainTask

from rocm_zoo.engine.overlay import OVERLAYS_DIR
from rocm_zoo.engine.pool import NetworkPool
from rocm_zoo.errors import InvalidRequest, ModelNotFound
from rocm_zoo.registry import BUNDLES
from rocm_zoo.server.audit.trail import AuditTrail, process_actor
from rocm_zoo.server.annotation.final_labels import Datalist, ModelLabels, TrainedOn, final_labels, split
from rocm_zoo.training.checkpoints import CheckpointStore, TrainingDetails
from rocm_zoo.training.runner import OVERLAY_FILE, Outcome, TrainPlan, train_config_of
from rocm_zoo.training.service import TrainingService, TrainJob
from rocm_zoo.training.vista3d_classes import class_overrides

logger = logging.getLogger(__name__)

DEFAULTS = {"max_epochs": 50, "val_split": 0.2, "pretrained": True}  # MONAI Label's train options and defaults


def class_keys(bundle: str, datalist: Datalist) -> tuple[tuple[str, Any], ...]:
    """Train config keys for what the labels' numbers mean. VISTA3D's labels hold its global class ids (the numbers
    its labels carry in /info), which its train.json, written for MSD spleen as classes 0 and 1, would not learn."""
    entry = BUNDLES.get(bundle)
    if entry is None or entry.kind != "vista3d":
        return ()
    return class_overrides({n: n for n in datalist.numbers.values()})


class BundleTrainer(TrainTask):
    """A bundle's train task as MONAI Label lists it; the work is done by `Training`."""

    def __init__(self, model: str, bundle_dir: Path, weights: str, labels: ModelLabels, training: "Training"):
        super().__init__(f"Fine-tune {bundle_dir.name} on the datastore's final labels ({train_config_of(bundle_dir)} "
                         "with the training overlay); served only if it validates better")
        self.model, self.bundle_dir, self.weights, self.labels = model, bundle_dir, weights, labels
        self.training = training

    def config(self) -> dict[str, Any]:
        return dict(DEFAULTS)

    def stats(self) -> dict[str, Any]:
        return self.training.service.stats(self.model)

    def __call__(self, request, datastore):  # MONAI Label's synchronous path (`app.train`)
        self.training.start([self.model], request)
        self.training.service.wait()
        return self.training.service.records()[-1]


class Training:
    def __init__(self, pool: NetworkPool, datastore: Callable[[], Any], device: str, trail: AuditTrail | None = None):
        self.pool = pool
        self.datastore = datastore
        self.device = device
        self.trail = trail
        self.trainers: dict[str, BundleTrainer] = {}
        self.service = TrainingService(self._publish)

    def add(self, model: str, bundle_dir: Path, weights: str, labels: dict[str, int], interactive: bool) -> None:
        """A train task for the model when its bundle ships a train config (every Model Zoo bundle does)."""
        if not train_config_of(bundle_dir):
            logger.info("rocm_zoo: %s has no train config; no train task", bundle_dir.name)
            return
        organs = {n: int(i) for n, i in labels.items() if int(i) != 0 and n.lower() != "background"}
        self.trainers[model] = BundleTrainer(model, Path(bundle_dir), weights, ModelLabels(model, organs, interactive),
                                             self)

    def start(self, models: list[str] | None, params: dict[str, Any] | None, enqueue: bool = False) -> dict[str, Any]:
        """Train `models` (None: every model whose final labels changed since its last training, as OHIF's "Update
        Model" asks). A model without enough labels is refused with the reason; 429 while a training runs."""
        params = dict(params or {})
        changed_only = models is None
        names = list(self.trainers) if models is None else models
        jobs, skipped = [], {}
        for name in names:
            trainer = self.trainers.get(name)
            if trainer is None:
                raise ModelNotFound(f"There is no train task '{name}'. Train tasks: {', '.join(self.trainers)}")
            own = params.get(name) if isinstance(params.get(name), dict) else {}
            request = {**DEFAULTS, **own, **{k: v for k, v in params.items() if k in DEFAULTS}}
            datalist = final_labels(self.datastore(), trainer.labels)
            if changed_only and datalist.fingerprint() == TrainedOn(trainer.bundle_dir).read():
                skipped[name] = "its final labels did not change since its last training"
                continue
            try:
                jobs.append(self._job(trainer, datalist, request))
            except InvalidRequest as e:
                if not changed_only:
                    raise
                skipped[name] = str(e)
        if not jobs:
            raise InvalidRequest("Nothing to train: " + "; ".join(f"{m}: {why}" for m, why in skipped.items()))
        records = self.service.start(jobs, enqueue)
        return {"started": [r.as_json() for r in records], "skipped": skipped}

    def _job(self, trainer: BundleTrainer, datalist: Datalist, request: dict[str, Any]) -> TrainJob:
        try:
            max_epochs, val_split = int(request["max_epochs"]), float(request["val_split"])
        except (TypeError, ValueError) as e:
            raise InvalidRequest(f"max_epochs takes a whole number and val_split a fraction ({e})") from e
        if max_epochs < 1:
            raise InvalidRequest(f"max_epochs must be at least 1 (not {max_epochs})")
        train, val = split(datalist, val_split)
        overlay = OVERLAYS_DIR / trainer.bundle_dir.name / OVERLAY_FILE
        plan = TrainPlan(trainer.bundle_dir, train_config_of(trainer.bundle_dir),
                         (overlay,) if overlay.is_file() else (), trainer.weights, train, val, self.device, max_epochs,
                         bool(request["pretrained"]), overrides=class_keys(trainer.bundle_dir.name, datalist))
        return TrainJob(trainer.model, plan, [d["id"] for d in datalist.items], request, datalist.fingerprint())

    def _publish(self, job: TrainJob, outcome: Outcome) -> dict[str, Any]:
        """A finished training: remember its labels; if it beat the served weights, keep it as a checkpoint, make it
        the served weights file and copy it into the warm networks in place (no recompile, no restart)."""
        bundle_dir, weights = job.plan.bundle_dir, job.plan.weights
        TrainedOn(bundle_dir).write(job.fingerprint)
        self._audit("training.finished", model=job.model, labels=job.labels, better=bool(outcome.better))
        if not outcome.better:
            return {"published": False}
        progress = outcome.progress
        details = TrainingDetails(
            measured_on=f"{len(job.plan.val_data)} validation label(s) (served weights: {progress.baseline_dice:.4f})",
            epochs=progress.epoch, labels=len(job.plan.train_data))
        store, accepted = CheckpointStore(bundle_dir, weights), []
        swapped = self.pool.swap_weights(Path(bundle_dir), weights, outcome.best_state,
                                         lambda: accepted.append(store.accept(outcome.best_state, progress.best_dice,
                                                                              details)))
        checkpoint = accepted[0]
        logger.info("rocm_zoo: %s serves checkpoint %s (validation Dice %.4f); %d warm network(s) updated in place",
                    job.model, checkpoint.id, progress.best_dice, swapped)
        self._audit("weights.swapped", model=job.model, checkpoint=checkpoint.id, score=round(progress.best_dice, 4),
                    warm_networks_updated=swapped)
        return {"published": True, "checkpoint": checkpoint.id, "warm_networks_updated": swapped}

    def _audit(self, event: str, **details: Any) -> None:
        if self.trail is not None:
            self.trail.record(event, process_actor("training"), **details)
