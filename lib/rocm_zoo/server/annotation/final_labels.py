"""Which of the datastore's final labels train which model, and whether they changed since its last training.

A final label trains a model when the label numbers it was saved with (`label_info`, which Slicer and OHIF send with
every save: name and index of each segment) are the model's own for those names. An automatic model must find all of
its organs in the label (a label of the spleen alone would teach a whole-body model that everything else is
background); an interactive model (DeepEdit, VISTA3D) learns from any of its organs. A label saved without
`label_info` says nothing about its numbers and trains no model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monai.data import partition_dataset

from rocm_zoo.engine.atomic_files import atomic_write_text
from rocm_zoo.errors import InvalidRequest

FINAL = "final"
MIN_LABELS = 2  # one to train on, one to validate on


@dataclass(frozen=True)
class ModelLabels:
    model: str
    labels: dict[str, int]  # the model's organ name -> label number (background excluded)
    interactive: bool


@dataclass(frozen=True)
class Datalist:
    items: list[dict[str, str]]  # {"image": path, "label": path, "id": image id}
    skipped: dict[str, str]  # image id -> why its final label does not train this model
    numbers: dict[str, int] = field(default_factory=dict)  # the organs those labels hold, by name (the model's numbers)

    def fingerprint(self) -> list[list[Any]]:
        """What changes when a label is added, replaced or removed."""
        return sorted([d["id"], os.path.getmtime(d["label"])] for d in self.items)


def saved_numbers(info: dict[str, Any]) -> dict[str, int] | None:
    """The {name: number} a label was saved with (background and unnamed entries left out), or None if unknown."""
    entries = info.get("label_info") if isinstance(info, dict) else None
    if not isinstance(entries, list):
        return None
    numbers = {}
    for e in entries:
        if isinstance(e, dict) and isinstance(e.get("name"), str) and str(e.get("idx", "")).lstrip("-").isdigit():
            numbers[e["name"]] = int(e["idx"])
    return {k: v for k, v in numbers.items() if v != 0 and k.lower() != "background"} or None


def fits(numbers: dict[str, int] | None, model: ModelLabels) -> str:
    """"" when the label trains the model, else why not."""
    if numbers is None:
        return "saved without label_info (label names and numbers)"
    wrong = {n: i for n, i in numbers.items() if model.labels.get(n) != i}
    if wrong:
        return f"its labels {wrong} are not {model.model}'s numbers"
    missing = sorted(set(model.labels) - set(numbers))
    if missing and not model.interactive:
        return f"it lacks {len(missing)} of {model.model}'s organs (e.g. {missing[0]})"
    return ""


def final_labels(store, model: ModelLabels) -> Datalist:
    """The datastore's final labels that train `model`, as the bundle's train config takes them."""
    items, skipped, used = [], {}, {}
    for image_id in sorted(store.get_labeled_images(FINAL)):
        info = store.get_label_info(store.get_label_by_image_id(image_id, FINAL), FINAL)
        numbers = saved_numbers(info)
        why = fits(numbers, model)
        if why:
            skipped[image_id] = why
            continue
        used.update(numbers)
        items.append({"image": store.get_image_uri(image_id), "label": store.get_label_uri(image_id, FINAL),
                      "id": image_id})
    return Datalist(items, skipped, used)


def split(datalist: Datalist, val_split: float) -> tuple[list[dict], list[dict]]:
    """Train and validation lists (MONAI's partition, as MONAI Label splits): at least one label on each side."""
    if not 0.0 < val_split < 1.0:
        raise InvalidRequest(f"val_split must be between 0 and 1 (not {val_split}): the new weights are served only "
                             "if they validate better than the served ones")
    items = [{"image": d["image"], "label": d["label"]} for d in datalist.items]
    if len(items) < MIN_LABELS:
        why = "; ".join(f"{i}: {w}" for i, w in list(datalist.skipped.items())[:3])
        raise InvalidRequest(f"Training needs at least {MIN_LABELS} final labels for this model (one to validate on); "
                             f"it has {len(items)}" + (f". Not used: {why}" if why else ""))
    n_val = min(max(1, round(len(items) * val_split)), len(items) - 1)
    train, val = partition_dataset(items, ratios=[len(items) - n_val, n_val], shuffle=False)
    return list(train), list(val)


class TrainedOn:
    """Per bundle, the label fingerprint of its last finished training (`<bundle>/models/checkpoints/trained_on.json`),
    so "Update Model" trains only the models whose labels changed."""

    def __init__(self, bundle_dir: Path):
        self.path = Path(bundle_dir) / "models" / "checkpoints" / "trained_on.json"

    def read(self) -> list | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def write(self, fingerprint: list) -> None:
        atomic_write_text(self.path, json.dumps(fingerprint))
