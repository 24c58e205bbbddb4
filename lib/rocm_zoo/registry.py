"""The one registry of bundles and tasks. Importable without torch: it feeds the app, the CLI, /info and the tests."""

from __future__ import annotations

from dataclasses import dataclass

from rocm_zoo.errors import ConfigError
from rocm_zoo.names import did_you_mean


@dataclass(frozen=True)
class BundleEntry:
    name: str  # directory name of the Model Zoo bundle, as downloaded
    config: str  # inference config inside the bundle
    weights: str  # weights file inside the bundle
    inferer: str  # how the bundle runs its network: "simple" (one forward), "sliding_window", "vista3d" (prompts)


@dataclass(frozen=True)
class TaskEntry:
    name: str  # MONAI Label model name, as clients see it
    model: str  # the `--conf models` name that enables it
    bundle: str
    kind: str  # MONAI Label infer type: "deepedit", "deepgrow", "vista3d" (interactive) or "segmentation" (automatic)
    interactive: bool  # interactive tasks are warmed before the server answers


BUNDLES: dict[str, BundleEntry] = {
    b.name: b
    for b in (
        BundleEntry("spleen_deepedit_annotation", "configs/inference.json", "models/model.pt", "simple"),
        BundleEntry("vista3d", "configs/inference.json", "models/model.pt", "vista3d"),
        BundleEntry("swin_unetr_btcv_segmentation", "configs/inference.json", "models/model.pt", "sliding_window"),
        BundleEntry("wholeBody_ct_segmentation", "configs/inference.json", "models/model.pt", "sliding_window"),
        BundleEntry("pancreas_ct_dints_segmentation", "configs/inference.yaml", "models/model.pt", "sliding_window"),
    )
}

TASKS: dict[str, TaskEntry] = {
    t.name: t
    for t in (
        TaskEntry("spleen_deepedit", "spleen_deepedit", "spleen_deepedit_annotation", "deepedit", True),
        TaskEntry("spleen_deepedit_seg", "spleen_deepedit", "spleen_deepedit_annotation", "segmentation", True),
        # OHIF v3 knows the type "vista3d"; Slicer lists only deepgrow/deepedit models for clicks.
        TaskEntry("vista3d", "vista3d", "vista3d", "vista3d", True),
        TaskEntry("vista3d_slicer", "vista3d", "vista3d", "deepgrow", True),
        TaskEntry("wholeBody_ct", "wholeBody_ct", "wholeBody_ct_segmentation", "segmentation", False),
        TaskEntry("swin_unetr_btcv", "swin_unetr_btcv", "swin_unetr_btcv_segmentation", "segmentation", False),
        TaskEntry("pancreas_ct_dints", "pancreas_ct_dints", "pancreas_ct_dints_segmentation", "segmentation", False),
    )
}

MODELS: tuple[str, ...] = tuple(dict.fromkeys(t.model for t in TASKS.values()))


def select_models(spec: str) -> tuple[str, ...]:
    """Parse `--conf models`: "all" or a comma list of model names. Unknown names are an error naming the near miss."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--conf models is empty; use 'all' or a comma list of: {', '.join(MODELS)}")
    if names == ["all"]:
        return MODELS
    for n in names:
        if n not in MODELS:
            hint = did_you_mean(n, MODELS)
            raise ConfigError(f"Unknown model '{n}' in --conf models.{hint} Known models: all, {', '.join(MODELS)}")
    return tuple(dict.fromkeys(names))


def tasks_of(model: str) -> list[TaskEntry]:
    return [t for t in TASKS.values() if t.model == model]
