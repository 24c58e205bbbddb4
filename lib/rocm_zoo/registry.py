"""The one registry of bundles and tasks. Importable without torch: it feeds the app, the CLI, /info, the warm-up, the
benchmarks, the sample bundles and the tests. Adding a bundle is one `BundleEntry` (with its tasks) here plus its
overlay file (lib/rocm_zoo/engine/overlays/<bundle>/inference_rocm.json); everything else derives from this table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocm_zoo.errors import BundleNotFound, ConfigError
from rocm_zoo.names import did_you_mean

# How a bundle runs its network, and so which task class serves it (the server package maps kind -> class):
# "deepedit" (one forward on image + guidance channels), "vista3d" (prompt-aware window inferer),
# "sliding_window" (automatic segmentation over the whole volume).
# The MONAI Label app folder, relative to the current folder (a checkout's apps/rocm_zoo; `rocm-zoo serve` makes it
# elsewhere). Here, not with the samples, so that commands that only need the folder do not import torch.
APP_DIR = Path("apps") / "rocm_zoo"
BUNDLE_KINDS = ("deepedit", "vista3d", "sliding_window")
# MONAI Label infer types: what viewers read from /info to decide where they offer a task.
TASK_TYPES = ("deepedit", "deepgrow", "vista3d", "segmentation")
VIEWERS = ("slicer", "ohif")
# What a client can ask, whatever the viewer's wire format:
# "whole_volume"  nothing but the image (automatic segmentation);
# "click"         one click at the centre of `organ` (DeepEdit guidance, VISTA3D's point head);
# "click_class"   that click with `organ`'s class as well (VISTA3D: the class head edited by the click);
# "classes"       `organ`'s class and `extra_classes` more of the bundle's "everything" classes (VISTA3D);
# "everything"    the bundle's "everything" classes (VISTA3D).
REQUEST_KINDS = ("whole_volume", "click", "click_class", "classes", "everything")


@dataclass(frozen=True)
class Request:
    """One request as a client sends it. The warm-up and `rocm-zoo bench` run the same ones."""

    name: str  # as the benchmark record and the logs name it
    kind: str  # one of REQUEST_KINDS
    organ: str = ""  # the organ clicked or prompted, by the bundle's label name
    extra_classes: int = 0  # "classes": more classes after the organ's
    points: int = 1  # "click", "click_class": how many clicks (the organ's centre, then the voxels beside it)
    warm: bool = True  # run at start-up, so no client request compiles
    bench: bool = True  # timed by `rocm-zoo bench` (network and inferer, no HTTP)


@dataclass(frozen=True)
class TaskEntry:
    name: str  # MONAI Label model name, as clients see it
    model: str  # the `--conf models` name that enables it
    bundle: str
    kind: str  # MONAI Label infer type (TASK_TYPES): "deepedit", "deepgrow", "vista3d" (interactive), "segmentation"
    interactive: bool  # interactive tasks are warmed before the server answers
    viewers: tuple[str, ...] = VIEWERS  # the viewers meant to use it


@dataclass(frozen=True)
class BundleEntry:
    name: str  # directory name of the Model Zoo bundle, as downloaded
    config: str  # inference config inside the bundle
    weights: str  # weights file inside the bundle
    kind: str  # one of BUNDLE_KINDS
    requests: tuple[Request, ...]  # what clients ask of it
    tasks: tuple[TaskEntry, ...]  # how the viewers ask it
    sample: str = ""  # module of rocm_zoo.samples.bundles that writes its sample bundle ("" for none)


WHOLE_VOLUME = Request("whole volume", "whole_volume")
SPLEEN_CLICK = Request("one click in the spleen", "click", "spleen")


def _segmentation(name: str, model: str, config: str = "configs/inference.json", sample: str = "") -> BundleEntry:
    return BundleEntry(name, config, "models/model.pt", "sliding_window", (WHOLE_VOLUME,),
                       (TaskEntry(model, model, name, "segmentation", False),), sample)


DEFAULT_ENTRIES: tuple[BundleEntry, ...] = (
    BundleEntry(
        "spleen_deepedit_annotation", "configs/inference.json", "models/model.pt", "deepedit", (SPLEEN_CLICK,),
        (TaskEntry("spleen_deepedit", "spleen_deepedit", "spleen_deepedit_annotation", "deepedit", True),
         TaskEntry("spleen_deepedit_seg", "spleen_deepedit", "spleen_deepedit_annotation", "segmentation", True)),
        sample="deepedit"),
    BundleEntry(
        "vista3d", "configs/inference.json", "models/model.pt", "vista3d",
        # One request per network path a client can take, so none compiles at request time: a click with a class
        # (both encoder branches, class head for one class), a click alone (point branch), one class (label branch),
        # several classes (the class head at the padded size "everything" also uses, at a fraction of its cost).
        (Request("one click in the spleen, class spleen", "click_class", "spleen", bench=False),
         # a second click count: the point transformer is compiled with dynamic shapes from its second shape on, so
         # no clinician's later click count compiles
         Request("two clicks in the spleen, class spleen", "click_class", "spleen", points=2, bench=False),
         Request("one click in the spleen", "click", "spleen", bench=False),
         Request("label_prompt [3] (spleen)", "classes", "spleen"),
         Request("two classes", "classes", "spleen", extra_classes=1, bench=False),
         Request("everything", "everything", warm=False)),
        # OHIF v3 knows the type "vista3d"; Slicer lists only deepgrow/deepedit models for clicks.
        (TaskEntry("vista3d", "vista3d", "vista3d", "vista3d", True, ("ohif",)),
         TaskEntry("vista3d_slicer", "vista3d", "vista3d", "deepgrow", True, ("slicer",))),
        sample="vista3d"),
    _segmentation("wholeBody_ct_segmentation", "wholeBody_ct", sample="wholebody_ct"),
    _segmentation("swin_unetr_btcv_segmentation", "swin_unetr_btcv", sample="swin_unetr_btcv"),
    _segmentation("pancreas_ct_dints_segmentation", "pancreas_ct_dints", "configs/inference.yaml",
                  sample="pancreas_dints"),
)

BUNDLES: dict[str, BundleEntry] = {}
TASKS: dict[str, TaskEntry] = {}
MODELS: tuple[str, ...] = ()


def _check(entry: BundleEntry) -> None:
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"Registry entry '{entry.name}': {what}")

    need(entry.name not in BUNDLES, "a bundle of that name is already registered")
    need(entry.kind in BUNDLE_KINDS, f"kind '{entry.kind}' is not one of {', '.join(BUNDLE_KINDS)}")
    need(bool(entry.tasks), "no task serves it")
    need(any(r.warm for r in entry.requests), "no request to warm it with")
    for r in entry.requests:
        need(r.kind in REQUEST_KINDS, f"request '{r.name}' has kind '{r.kind}', not one of {', '.join(REQUEST_KINDS)}")
    for t in entry.tasks:
        need(t.bundle == entry.name, f"task '{t.name}' names bundle '{t.bundle}'")
        need(t.name not in TASKS, f"task '{t.name}' is already registered")
        need(t.kind in TASK_TYPES, f"task '{t.name}' has type '{t.kind}', not one of {', '.join(TASK_TYPES)}")
        need(set(t.viewers) <= set(VIEWERS), f"task '{t.name}' names viewers {t.viewers}; known: {VIEWERS}")


def register(entry: BundleEntry) -> None:
    """Adds a bundle and its tasks to the table; errors name what is wrong with the entry."""
    global MODELS
    _check(entry)
    BUNDLES[entry.name] = entry
    TASKS.update({t.name: t for t in entry.tasks})
    MODELS = tuple(dict.fromkeys(t.model for t in TASKS.values()))


def unregister(name: str) -> None:
    """Removes a bundle and its tasks (tests that register a bundle of their own put the table back)."""
    global MODELS
    entry = BUNDLES.pop(name)
    for t in entry.tasks:
        TASKS.pop(t.name, None)
    MODELS = tuple(dict.fromkeys(t.model for t in TASKS.values()))


for _entry in DEFAULT_ENTRIES:
    register(_entry)


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


def batch_models() -> tuple[str, ...]:
    """Tasks that segment a whole study without prompts: what `rocm-zoo batch` and /batch/infer run."""
    return tuple(name for name, t in TASKS.items() if t.kind == "segmentation")


def default_task(kind: str, interactive: bool | None = None) -> str:
    """The first registered task of this MONAI Label type (and interactive or automatic, when asked): the model the
    benchmarks and the CLI use unless told another."""
    for name, task in TASKS.items():
        if task.kind == kind and interactive in (None, task.interactive):
            return name
    raise ConfigError(f"no registered task of type '{kind}'" + ("" if interactive is None else
                                                               f" ({'interactive' if interactive else 'automatic'})"))


def viewer_tasks(viewer: str, types: tuple[str, ...] = TASK_TYPES) -> tuple[str, ...]:
    """Tasks meant for `viewer` (of these MONAI Label types)."""
    return tuple(name for name, t in TASKS.items() if viewer in t.viewers and t.kind in types)


# Where OHIF v3's MONAI Label panel runs a task, by its type: the Auto-Segmentation tab ("auto") or Point Prompts
# ("point", a click on the organ). OHIF decides this from /info; `rocm-zoo bench-ohif` drives these two.
OHIF_TABS = {"segmentation": "auto", "vista3d": "point"}


def ohif_actions() -> dict[str, str]:
    """How OHIF runs each task meant for it: task name -> OHIF_TABS value."""
    return {name: OHIF_TABS[TASKS[name].kind] for name in viewer_tasks("ohif", tuple(OHIF_TABS))}


HOW_TO_GET_BUNDLES = (
    "Put the Model Zoo bundle there (e.g. `python -m monai.bundle download {bundle} --bundle_dir {model_dir}` on a "
    "machine with internet access, then copy the folder), or generate rocm_zoo's sample bundle with "
    "`rocm-zoo sample --model-dir {model_dir}` (synthetic weights, not a clinical model)."
)


def bundle_missing_message(bundle: str, model_dir: Path) -> str:
    where = model_dir / bundle
    return f"Bundle '{bundle}' not found at {where}. " + HOW_TO_GET_BUNDLES.format(bundle=bundle, model_dir=model_dir)


def find_bundle(bundle: str, model_dir: Path) -> Path:
    """The bundle's folder under `model_dir`; BundleNotFound saying how to get it when its config is not there."""
    bundle_dir = Path(model_dir) / bundle
    if not (bundle_dir / BUNDLES[bundle].config).is_file():
        raise BundleNotFound(bundle_missing_message(bundle, Path(model_dir)))
    return bundle_dir
