"""`/activelearning/uncertainty`: the unlabelled study an automatic model is least sure about, to annotate next.

A study's score comes from the served task itself (its preprocessing, its warm network, its inferer: the bundle's
sliding window), run on the preprocessed volume and on `flips` mirrored copies of it; see
rocm_zoo.engine.flip_uncertainty for the score. That is (flips + 1) network passes per study, at the scheduler's batch
priority: clicks and automatic requests take the device first, and a study starts only while no request runs.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from monailabel.datastore.local import LocalDatastore
from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.strategy import Strategy

from rocm_zoo.engine.flip_uncertainty import FlipEnsemble, flip_axes
from rocm_zoo.engine.image_cache import file_identity
from rocm_zoo.engine.scheduler import Priority, Work, working_as
from rocm_zoo.engine.volume_check import first_line
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.server.tasks.bundle import OverlayBundleTask

logger = logging.getLogger(__name__)

# How often a ranking waiting for the server's requests to finish looks again (as a batch does).
YIELD_POLL_S = 0.02


def flip_score(task: OverlayBundleTask, image_path: str, flips: int) -> float:
    """The task's softmax on the image and on its flips (each flipped back), scored; in the caller's scheduler work."""
    data = copy.deepcopy(task._config)
    data.update({"image": image_path, "image_path": image_path})
    data = task.run_pre_transforms(data, task.pre_transforms(data))
    image = data[task.input_key]
    image = image.as_tensor() if hasattr(image, "as_tensor") else image
    ensemble = FlipEnsemble()
    for axes in ((),) + flip_axes(flips):
        dims = [a + 1 for a in axes]  # after the channel dimension
        flipped = image.flip(dims) if dims else image
        logits = task.run_inferer({**data, task.input_key: flipped}, device=task.device)[task.output_label_key]
        logits = logits.as_tensor() if hasattr(logits, "as_tensor") else logits
        ensemble.add(torch.softmax((logits.flip(dims) if dims else logits).float(), dim=0))
    return ensemble.score()


class UncertaintyStrategy(Strategy):
    def __init__(self, task: OverlayBundleTask, flips: int, max_new: int,
                 requests_running: Callable[[], bool] = lambda: False):
        model = task.entry.name
        super().__init__(
            f"The unlabelled study (no 'final' label) that {model} is least sure about: its prediction on the image "
            f"and on {flips} mirrored copies, averaged; score = entropy of that average over the voxels any of them "
            f"calls foreground (0 to 1). Scores are kept until the image or the weights change; one call scores at "
            f"most {max_new} new studies, at batch priority, and answers with the best scored one: 'unscored' > 0 "
            f"means later calls will rank more.")
        self.task = task
        self.model = model
        self.flips = flips
        self.max_new = max_new
        self._requests_running = requests_running
        self._scores: dict[tuple, float | str] = {}  # (image identity, weights mtime) -> score, or why it failed
        self._lock = threading.Lock()  # one ranking at a time: a second caller then finds the first one's scores

    def __call__(self, request: dict, datastore: Datastore) -> dict[str, Any] | None:
        images = sorted(datastore.get_unlabeled_images(request.get("label_tag"), request.get("labels")))
        if not images:
            return None
        task = self.task
        with self._lock, working_as(Work(Priority.BATCH, "activelearning", what=f"uncertainty ranking ({self.model})")):
            spec = task.network_spec()
            weights = (Path(spec.bundle_dir) / spec.weights).stat().st_mtime
            keys = {image: (self._identity(image, datastore), weights) for image in images}
            new = [image for image in images if keys[image] not in self._scores]
            for image in new[:self.max_new]:
                self._score(task, image, keys[image], datastore)
        scores = {i: self._scores[k] for i, k in keys.items() if isinstance(self._scores.get(k), float)}
        failed = {i: self._scores[k] for i, k in keys.items() if isinstance(self._scores.get(k), str)}
        if not scores:
            first = next(iter(failed.items()))
            raise InvalidRequest(f"{self.model} could not score any unlabelled study ({first[0]}: {first[1]})")
        best = max(scores, key=lambda i: (scores[i], i))
        return {"id": best, "score": round(scores[best], 6), "model": self.model, "flips": self.flips,
                "scored": len(scores), "unscored": len(images) - len(scores) - len(failed), "failed": len(failed)}

    @staticmethod
    def _identity(image: str, datastore: Datastore) -> tuple:
        # A local file can be replaced under the same id; a DICOMweb series is immutable content under its UID (and
        # asking for its path would download it).
        if isinstance(datastore, LocalDatastore):
            return file_identity(datastore.get_image_uri(image))
        return (image,)

    def _score(self, task: OverlayBundleTask, image: str, key: tuple, datastore: Datastore) -> None:
        while self._requests_running():  # its host work (loading, resampling) would slow the requests
            time.sleep(YIELD_POLL_S)
        start = time.perf_counter()
        try:
            self._scores[key] = flip_score(task, datastore.get_image_uri(image), self.flips)
            logger.info("uncertainty (%s): %s scores %.4f (%.1f s)", self.model, image, self._scores[key],
                        time.perf_counter() - start)
        except Exception as e:  # one unreadable study is left out, the others are ranked
            self._scores[key] = f"{type(e).__name__}: {first_line(e)}"
            logger.warning("uncertainty (%s): %s cannot be scored: %s", self.model, image, self._scores[key])
