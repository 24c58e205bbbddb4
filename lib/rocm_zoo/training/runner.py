"""One training of one bundle: the bundle's own train config with the training overlay, run the way MONAI Label's
`BundleTrainTask` runs it (same overrides: bundle_root, device, max_epochs, the train and validation datalists), but in
this process and at the device scheduler's lowest class.

Each training step (forward, loss, backward, optimiser step) and each other forward (validation, DeepEdit's simulated
clicks) is one device turn of background work, so a click waits for at most one of them; host work (data loading, the
click simulation between forwards) takes no turn (on the H200 a turn per whole DeepEdit iteration, clicks included,
left clicks waiting up to 550 ms at p90). The served model is never touched here: the run validates the served
weights first (the baseline), keeps the best weights it validates, and says whether they beat the baseline;
publishing is the caller's decision.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from monai.bundle import ConfigParser

from rocm_zoo.engine.backend import detect_backend
from rocm_zoo.engine.overlay import bundle_on_path, load_config, load_weights
from rocm_zoo.engine.scheduler import Work, device_turn, working_as
from rocm_zoo.errors import ConfigError, InvalidRequest, WorkCancelled

logger = logging.getLogger(__name__)

TRAIN_CONFIGS = ("configs/train.json", "configs/train.yaml")
OVERLAY_FILE = "train_rocm.json"
# Handlers of the bundle's config that write files the run must not write: the served weights file (CheckpointSaver
# saves the best model as models/model.pt), a second start checkpoint (the run loads the served weights itself,
# strictly), experiment trackers' folders inside the bundle.
DROPPED_HANDLERS = ("CheckpointSaver", "CheckpointLoader", "TensorBoardStatsHandler", "TensorBoardImageHandler",
                    "MLFlowHandler", "ClearMLStatsHandler", "ClearMLImageHandler")


def train_config_of(bundle_dir: Path) -> str | None:
    """The bundle's train config inside it (json or yaml, as the Model Zoo ships them), or None."""
    return next((c for c in TRAIN_CONFIGS if (Path(bundle_dir) / c).is_file()), None)


@dataclass(frozen=True)
class TrainPlan:
    bundle_dir: Path
    config: str  # TRAIN_CONFIGS entry inside the bundle
    overlays: tuple[Path, ...]
    weights: str  # the served weights file inside the bundle: the start point and the baseline
    train_data: list[dict[str, str]]  # {"image": path, "label": path}
    val_data: list[dict[str, str]]
    device: str
    max_epochs: int
    pretrained: bool = True  # start from the served weights (else from the config's initialisation)
    overrides: tuple[tuple[str, Any], ...] = ()  # more config keys to set (benchmarks: the fp32 baseline, data)


@dataclass
class Progress:
    """What the viewers' progress bars read (MONAI Label's `train_stats` keys) and what `/train/` reports."""

    state: str = "starting"  # starting, validating (the served weights), training, done, stopped, failed
    start_ts: float = field(default_factory=time.time)
    end_ts: float | None = None  # set as the run ends (done, stopped or failed): its time stops growing there
    epoch: int = 0
    total_epochs: int = 0
    iteration: int = 0  # within the current epoch, as total_iterations counts an epoch's (ignite counts the whole run)
    total_iterations: int = 0
    loss: float | None = None
    baseline_dice: float | None = None  # the served weights on this validation set
    best_dice: float | None = None
    best_epoch: int = 0
    epoch_seconds: list[float] = field(default_factory=list)
    iteration_ends: list[float] = field(default_factory=list)  # perf_counter() at the end of each iteration
    samples_per_iteration: int = 0
    losses: list[float] = field(default_factory=list)
    validations: list[tuple[int, float]] = field(default_factory=list)  # (epoch, validation Dice)
    train_samples: int = 0
    val_samples: int = 0

    def seconds_left(self) -> float | None:
        if not self.epoch_seconds or self.state != "training":
            return None
        recent = self.epoch_seconds[-3:]
        return round(sum(recent) / len(recent) * (self.total_epochs - self.epoch), 1)

    def end(self, state: str) -> None:
        self.state, self.end_ts = state, time.time()

    def as_stats(self) -> dict[str, Any]:
        elapsed = int((self.end_ts or time.time()) - self.start_ts)
        return {
            "state": self.state,
            "epoch": self.epoch,
            "total_epochs": self.total_epochs,
            "iteration": self.iteration,
            "total_iterations": self.total_iterations,
            "loss": self.loss,
            "best_metric": self.best_dice,
            "best_metric_epoch": self.best_epoch,
            "baseline_metric": self.baseline_dice,
            "key_metric_name": "val_mean_dice",
            "start_ts": int(self.start_ts),
            "current_time" if self.state in ("starting", "validating", "training") else "total_time": elapsed,
            "time_left_s": self.seconds_left(),
            "train_samples": self.train_samples,
            "val_samples": self.val_samples,
        }


@dataclass
class Outcome:
    state: str  # done, stopped, failed
    better: bool  # the best validated weights beat the served ones
    reason: str
    best_state: dict[str, torch.Tensor] | None = None  # on the host
    progress: Progress | None = None


class TrainingRun:
    def __init__(self, plan: TrainPlan, work: Work):
        self.plan = plan
        self.work = work  # its `cancelled` stops the run at its next iteration
        self.progress = Progress(total_epochs=plan.max_epochs, train_samples=len(plan.train_data),
                                 val_samples=len(plan.val_data))
        self._best_state: dict[str, torch.Tensor] | None = None
        self._finish_early = threading.Event()

    def stop(self) -> None:
        self.work.cancelled.set()

    def finish_early(self) -> None:
        """End after the current epoch, validated, as if no more epochs had been asked for: judged as a finished run
        (`stop` is the one that discards)."""
        self._finish_early.set()

    def run(self) -> Outcome:
        with working_as(self.work):
            try:
                return self._run()
            except WorkCancelled:
                self.progress.end("stopped")
                return Outcome("stopped", False, "stopped before it ended; the served weights are kept",
                               progress=self.progress)
            except Exception as e:  # a crashed training leaves the served model as it was
                self.progress.end("failed")
                logger.exception("training of %s failed", self.plan.bundle_dir.name)
                return Outcome("failed", False, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                               progress=self.progress)

    def _run(self) -> Outcome:
        plan = self.plan
        if not plan.train_data or not plan.val_data:
            raise InvalidRequest("Training needs final labels to train on and at least one to validate on")
        trainer, evaluator, network, device = self._build()
        self._take_turns(trainer, device)
        self._take_turns(evaluator, device)
        self._forward_in_turns(network, device)
        initial = None if plan.pretrained else _host_copy(network)
        load_weights(network, Path(plan.bundle_dir) / plan.weights)

        self.progress.state = "validating"
        evaluator.run()
        self.progress.baseline_dice = _metric(evaluator)
        logger.info("%s: served weights validate at %.4f (%d labels)", plan.bundle_dir.name,
                    self.progress.baseline_dice, len(plan.val_data))
        if initial is not None:
            network.load_state_dict(initial)

        self._follow(trainer, evaluator, network)
        self.progress.state = "training"
        trainer.run()
        self.progress.end("done")
        best, baseline = self.progress.best_dice, self.progress.baseline_dice
        if best is None:
            return Outcome("done", False, "no validation ran; the served weights are kept", progress=self.progress)
        if best <= baseline:
            return Outcome("done", False, f"best validation Dice {best:.4f} does not beat the served weights' "
                           f"{baseline:.4f}; the served weights are kept", progress=self.progress)
        return Outcome("done", True, f"validation Dice {baseline:.4f} -> {best:.4f} (epoch {self.progress.best_epoch})",
                       self._best_state, self.progress)

    # -- building the bundle's trainer -------------------------------------------------------------------------------
    def _build(self):
        plan = self.plan
        parser = load_config(plan.bundle_dir, plan.config, plan.overlays)
        backend = detect_backend(plan.device)
        epochs_keys = _referenced(parser, "train#trainer#max_epochs")
        overrides: dict[str, Any] = {
            "device": f"$torch.device('{backend.device}')",
            "train#trainer#max_epochs": plan.max_epochs,
            "train#dataset#data": plan.train_data,
            "validate#dataset#data": plan.val_data,
        }
        if not backend.bf16:  # the overlay asks for bf16 autocast; this device has no fast bf16: fp32, one log line
            overrides["train#trainer#amp"] = overrides["validate#evaluator#amp"] = False
            logger.info("training on %s without bf16 autocast (not supported natively here)", backend.device)
        for key, value in [*overrides.items(), *plan.overrides]:
            parser[key] = value
        for key in epochs_keys:  # e.g. VISTA3D's `max_epochs: @epochs`, which its learning-rate schedule reads too
            parser[key] = plan.max_epochs
        for key in ("train#handlers", "validate#handlers"):
            handlers = parser.get(key) or []
            parser[key] = [h for h in handlers if not _is_dropped(h)]
        for key in ("train#dataset", "validate#dataset"):
            # A CacheDataset fills its cache while it is built; built under the bundle import lock, that would hold
            # every request's transform parsing for as long. Caching as it goes instead costs the first epoch.
            if "CacheDataset" in str(parser.get(f"{key}#_target_", "")):
                parser[f"{key}#runtime_cache"] = True
        with bundle_on_path(plan.bundle_dir):
            trainer = _parsed(parser, "train#trainer")
            evaluator = _parsed(parser, "validate#evaluator")
            network = parser.get_parsed_content("network")
        if not _has_validation(parser):
            raise ConfigError(f"{plan.config} of {plan.bundle_dir.name} runs no validation (no ValidationHandler in "
                              "train#handlers): a training that cannot be compared with the served weights is not run")
        return trainer, evaluator, network, backend.device

    @staticmethod
    def _take_turns(engine, device: str) -> None:
        """Device turns for device work only: the training step (forward, loss, backward, optimiser step) is one turn,
        and every other forward (DeepEdit's simulated clicks run several per iteration) is one (`_forward_in_turns`);
        what runs on the host between them (data, click simulation) takes none, so a click never waits for it.
        MONAI's workflows run the step as `engine._iteration`, called by ignite or by the bundle's iteration_update."""
        step = engine._iteration

        def step_in_turn(e, batch):
            with device_turn(device):
                return step(e, batch)

        if getattr(engine._process_function, "__func__", None) is getattr(step, "__func__", None):
            engine._process_function = step_in_turn  # no iteration_update: ignite calls the step itself
        engine._iteration = step_in_turn

    @staticmethod
    def _forward_in_turns(network: torch.nn.Module, device: str) -> None:
        forward = network.forward

        def forward_in_turn(*args, **kwargs):
            with device_turn(device):  # reentrant: inside the step's turn this is the same turn
                return forward(*args, **kwargs)

        network.forward = forward_in_turn

    def _follow(self, trainer, evaluator, network) -> None:
        from ignite.engine import Events

        p = self.progress

        @trainer.on(Events.EPOCH_STARTED)
        def _epoch_started(engine):
            engine.state.rocm_zoo_epoch_start = time.perf_counter()
            p.total_iterations = engine.state.epoch_length or 0

        @trainer.on(Events.ITERATION_COMPLETED)
        def _iteration(engine):
            per_epoch = engine.state.epoch_length or 0
            p.iteration = (engine.state.iteration - 1) % per_epoch + 1 if per_epoch else engine.state.iteration
            p.loss = _loss(engine.state.output)
            p.iteration_ends.append(time.perf_counter())
            if not p.samples_per_iteration:
                p.samples_per_iteration = _batch_size(engine.state.batch)
            if p.loss is not None:
                p.losses.append(p.loss)

        @trainer.on(Events.EPOCH_COMPLETED)  # after the config's ValidationHandler, attached when it was built
        def _epoch(engine):
            p.epoch = engine.state.epoch
            p.epoch_seconds.append(time.perf_counter() - engine.state.rocm_zoo_epoch_start)
            if self._finish_early.is_set():
                if not p.validations or p.validations[-1][0] != engine.state.epoch:
                    evaluator.run()
                engine.terminate()

        @evaluator.on(Events.EPOCH_COMPLETED)
        def _validated(engine):
            dice = _metric(engine)
            p.validations.append((trainer.state.epoch, dice))
            if p.best_dice is None or dice > p.best_dice:
                p.best_dice, p.best_epoch = dice, trainer.state.epoch
                self._best_state = _host_copy(network)
            logger.info("%s epoch %d: validation Dice %.4f (best %.4f, served %.4f)", self.plan.bundle_dir.name,
                        trainer.state.epoch, dice, p.best_dice, p.baseline_dice)


def _parsed(parser: ConfigParser, key: str):
    try:
        return parser.get_parsed_content(key, instantiate=True)
    except KeyError as e:
        raise ConfigError(f"the bundle's train config has no '{key}' ({e})") from e


def _referenced(parser: ConfigParser, key: str) -> list[str]:
    """The key `key` refers to where its value is a plain reference ("@epochs"), else none."""
    raw = parser.get(key)
    return [raw[1:]] if isinstance(raw, str) and raw.startswith("@") and raw[1:] in parser else []


def _is_dropped(handler: Any) -> bool:
    target = str(handler.get("_target_", "")) if isinstance(handler, dict) else ""
    return target.rsplit(".", 1)[-1] in DROPPED_HANDLERS


def _has_validation(parser: ConfigParser) -> bool:
    return any(isinstance(h, dict) and str(h.get("_target_", "")).endswith("ValidationHandler")
               for h in parser.get("train#handlers") or [])


def _metric(evaluator) -> float:
    name = evaluator.state.key_metric_name
    return float(evaluator.state.metrics[name])


def _loss(output: Any) -> float | None:
    """The loss of an iteration: MONAI's trainers put it in each decollated item (or the batch dict) under "loss"."""
    item = output[0] if isinstance(output, list) and output else output
    loss = item.get("loss") if isinstance(item, dict) else None
    return None if loss is None else float(loss)


def _batch_size(batch: Any) -> int:
    """Samples in an iteration's batch: MONAI's workflows decollate it into a list of items by the time the iteration
    completes; a collated dict holds them along its first dimension."""
    if isinstance(batch, list):
        return len(batch)
    image = batch.get("image") if isinstance(batch, dict) else None
    return int(image.shape[0]) if torch.is_tensor(image) else 0


def _host_copy(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    module = getattr(network, "_orig_mod", network)
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
