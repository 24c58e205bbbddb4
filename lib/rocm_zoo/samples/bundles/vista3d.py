"""Honest sample of the Model Zoo bundle `vista3d` (upstream 0.6.0): its inference config, metadata and `scripts`.

`configs/inference.json` keeps the upstream layout, keys and quirks: `"$import scripts"` (the bundle's own package,
importable only when the bundle root is on `sys.path`), the `scripts.inferer.Vista3dInferer` inferer and
`scripts.evaluator.Vista3dEvaluator` evaluator, `vista3d132` built through `network_def`, the 117 "everything" labels,
the `subclass` map, Spacingd 1.5 mm, CropForegroundd, VistaPreTransformd, the HU window -963.8..1053.7, RAS, and the
VistaPostTransformd / Invertd(nearest) / nan_to_num / SaveImaged postprocessing.

Reader: the merged upstream `inference.json` gives LoadImaged no reader (MONAI picks NibabelReader for .nii.gz), and
so does this sample. A "NibabelGPUReader" appears only in an unmerged draft (model-zoo PR #707, built on the unmerged
MONAI PR #8188, GPU loading through kvikio/cupy); MONAI 1.6.1 has no such reader (LoadImaged raises ValueError
"did you mean 'nibabelreader'"), on the CPU or the GPU.

The `scripts` package is written here from scratch (nothing copied from upstream): an inferer with the upstream
constructor and call signature, and a short evaluator for user prompts only (no validation against labels). Two
choices of ours, both noted where they are made: the evaluator autocasts for the device it runs on (upstream
hard-codes "cuda", so AMP is silently off on a CPU), and it hands the network a plain tensor (MONAI's own
SupervisedEvaluator does the same when it compiles).

`configs/train.json` mirrors upstream's keys and structure (the MSD Task09 spleen fine-tuning defaults: output_classes
2, label_set null, 128^3 patches, DiceCELoss with sigmoid, AdamW, WarmupCosineSchedule, early stopping and MLflow
switched off, `initialize` / `run`, no `finalize`) with `scripts.trainer.Vista3dTrainer` and the evaluator validating
against labels. What differs, and why:
- The sample's trainer (written here, a SupervisedTrainer subclass) samples class and point prompts with MONAI's own
  `monai.apps.vista3d.sampler.sample_prompt_pairs`, as upstream's does, but autocasts for the device it runs on (as
  the evaluator), gives the Dice loss a float target (MONAI's squared_pred Dice takes the norm of a bool one and
  fails) and skips a patch with no prompt instead of failing.
- Validation runs the automatic (class) head only (`val_head` "auto", upstream's default): every class of
  `label_set` is prompted at once and scored against the labels; no point-only validation.
- `scripts/__init__.py` has its own `score_function` (the validation Dice) for the disabled EarlyStopHandler.
- Upstream's `configs/msd_task09_spleen_folds.json` is not written: `train_datalist` / `val_datalist` read it only
  when the datalists are not given (the training runner gives them).
- `tiny` loads data without workers (so without `persistent_workers`, which needs them) and uses 64^3 patches.

Sizes: `full` is `vista3d132` as upstream (encoder_embed_dim 48, 218 M parameters, 128^3 patches); `tiny` is the same
network class, the same 132 classes and the same config key with encoder_embed_dim 8 (the smallest the point head's
4-head attention allows) and 64^3 patches, for CPU tests. Weights are untrained and seeded. Not a clinical model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rocm_zoo.samples.bundles.common import (TRAINED, TINY_NUM_WORKERS, check_size, sample_version, write_json,
                                             write_text)

NAME = "vista3d"
UPSTREAM_VERSION = "0.6.0"
EMBED_DIM = {"tiny": 8, "full": 48}
PATCH = {"tiny": [64, 64, 64], "full": [128, 128, 128]}

# The 132 global classes (facts from the upstream metadata `channel_def` and docs/labels.json).
LABELS: dict[int, str] = dict(enumerate([
    "liver", "kidney", "spleen", "pancreas", "right kidney", "aorta", "inferior vena cava", "right adrenal gland",
    "left adrenal gland", "gallbladder", "esophagus", "stomach", "duodenum", "left kidney", "bladder",
    "prostate or uterus", "portal vein and splenic vein", "rectum", "small bowel", "lung", "bone", "brain",
    "lung tumor", "pancreatic tumor", "hepatic vessel", "hepatic tumor", "colon cancer primaries",
    "left lung upper lobe", "left lung lower lobe", "right lung upper lobe", "right lung middle lobe",
    "right lung lower lobe",
    *[f"vertebrae {v}" for v in ("L5", "L4", "L3", "L2", "L1")], *[f"vertebrae T{i}" for i in range(12, 0, -1)],
    *[f"vertebrae C{i}" for i in range(7, 0, -1)],
    "trachea", "left iliac artery", "right iliac artery", "left iliac vena", "right iliac vena", "colon",
    *[f"left rib {i}" for i in range(1, 13)], *[f"right rib {i}" for i in range(1, 13)],
    "left humerus", "right humerus", "left scapula", "right scapula", "left clavicula", "right clavicula",
    "left femur", "right femur", "left hip", "right hip", "sacrum", "left gluteus maximus", "right gluteus maximus",
    "left gluteus medius", "right gluteus medius", "left gluteus minimus", "right gluteus minimus",
    "left autochthon", "right autochthon", "left iliopsoas", "right iliopsoas", "left atrial appendage",
    "brachiocephalic trunk", "left brachiocephalic vein", "right brachiocephalic vein", "left common carotid artery",
    "right common carotid artery", "costal cartilages", "heart", "left kidney cyst", "right kidney cyst", "prostate",
    "pulmonary vein", "skull", "spinal cord", "sternum", "left subclavian artery", "right subclavian artery",
    "superior vena cava", "thyroid gland", "vertebrae S1", "bone lesion", "kidney mass", "liver tumor",
    "vertebrae L6", "airway",
], start=1))

_SCRIPTS_INIT = '''"""The vista3d bundle's own code (rocm_zoo sample): its inferer, evaluator and trainer."""


def score_function(engine):
    """What the train config's EarlyStopHandler watches: the validation Dice."""
    return engine.state.metrics["val_mean_dice"]
'''

# The bundle's `scripts/inferer.py`.
_SCRIPTS_INFERER = '''"""VISTA3D's inferer: a sliding window over the volume, or only the windows around the clicks."""

from __future__ import annotations

from monai.apps.vista3d.inferer import point_based_window_inferer
from monai.inferers import Inferer, sliding_window_inference


class Vista3dInferer(Inferer):
    """Runs a VISTA3D network with its prompts; returns logits [1, B, H, W, D], one map per prompted object.

    With clicks and `use_point_window`, only the windows centred on the clicks run (voxels outside them come back
    NaN); otherwise a sliding window (`roi_size`, `overlap`, `sw_batch_size`, replicate padding) covers the volume.
    Every forward gets the prompts and its window's coordinates, which the network needs to place the clicks.
    """

    def __init__(self, roi_size, overlap=0.25, sw_batch_size=1, use_point_window=False):
        super().__init__()
        self.roi_size = list(roi_size)
        self.overlap = overlap
        self.sw_batch_size = sw_batch_size
        self.use_point_window = use_point_window

    def __call__(self, inputs, network, point_coords=None, point_labels=None, class_vector=None, labels=None,
                 label_set=None, prompt_class=None, prev_mask=None, **kwargs):
        """`point_coords` [B, N, 3] voxel coordinates of `inputs`, `point_labels` [B, N] (1 fg, 0 bg, 3/2 for the
        special classes), `class_vector` and `prompt_class` [B, 1] global class ids, `prev_mask` [1, B, H, W, D]
        logits of an earlier answer; `labels` / `label_set` are for point validation against ground truth."""
        if prompt_class is None:
            prompt_class = class_vector  # tells the point head which class the clicks are for
        if class_vector is not None and bool((class_vector > _point_head(network).last_supported).any()):
            class_vector = None  # a zero-shot class has no class-head embedding: the clicks alone segment it
        prompts = dict(point_coords=point_coords, point_labels=point_labels, class_vector=class_vector,
                       prompt_class=prompt_class, prev_mask=prev_mask, labels=labels, label_set=label_set,
                       transpose=True, **kwargs)
        if self.use_point_window and point_coords is not None:
            return point_based_window_inferer(inputs, self.roi_size, network, **prompts)
        return sliding_window_inference(inputs, self.roi_size, self.sw_batch_size, network, overlap=self.overlap,
                                        padding_mode="replicate", with_coord=True, **prompts)


def _point_head(network):
    return getattr(network, "module", network).point_head  # plain, DataParallel/DDP-wrapped or compiled network
'''

# The bundle's `scripts/evaluator.py`.
_SCRIPTS_EVALUATOR = '''"""VISTA3D's evaluator: one request (an image and its prompts) per iteration."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from monai.data import MetaTensor
from monai.engines import SupervisedEvaluator
from monai.engines.utils import IterationEvents
from monai.transforms import reset_ops_id
from monai.utils.enums import CommonKeys as Keys

PROMPT_KEYS = ("label_prompt", "points", "point_labels")


class Vista3dEvaluator(SupervisedEvaluator):
    """`hyper_kwargs`: {"user_prompt": true, "everything_labels": [...]} for requests, or {"user_prompt": false,
    "output_classes": n, "label_set": [...] or null, "val_head": "auto"} to validate against labels.

    A request may carry `label_prompt` (global class ids), `points` (voxel coordinates of the image as stored) and
    `point_labels`; with neither, the "everything" labels are segmented. Validation prompts every class of `label_set`
    (default 0 .. output_classes - 1) at once, one prediction channel each: the automatic (class) head only, no
    point validation. Other arguments are SupervisedEvaluator's."""

    def __init__(self, *args, hyper_kwargs: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.hyper_kwargs = dict(hyper_kwargs or {})
        if not self.hyper_kwargs.get("user_prompt", True) and self.hyper_kwargs.get("val_head", "auto") != "auto":
            raise ValueError("Vista3dEvaluator validates the automatic head only: set hyper_kwargs val_head to 'auto'")

    def _iteration(self, engine, batchdata):
        if batchdata is None:
            raise ValueError("Must provide batch data for current iteration.")
        if not self.hyper_kwargs.get("user_prompt", True):
            return self._validate(engine, batchdata)
        image = batchdata[Keys.IMAGE].to(engine.state.device)
        label_prompt, points, point_labels = (_item0(batchdata.get(k)) for k in PROMPT_KEYS)
        if label_prompt is None and points is None:
            label_prompt = list(self.hyper_kwargs["everything_labels"])
        if points is not None and (point_labels is None or len(point_labels) != len(points)):
            raise ValueError("points need point_labels, one per point")
        if points is not None and label_prompt is not None and len(label_prompt) != 1:
            raise ValueError("with points, label_prompt can name one class only")
        device = image.device
        class_vector = None if label_prompt is None else torch.as_tensor(label_prompt, device=device).reshape(-1, 1)
        coords = labels = None
        if points is not None:
            coords = _to_preprocessed_voxels(torch.as_tensor(points, dtype=torch.float64), image).float()[None]
            coords, labels = coords.to(device), torch.as_tensor(point_labels, device=device).reshape(1, -1)

        engine.state.output = {Keys.IMAGE: image, Keys.LABEL: None}
        # AMP for the device the network runs on (upstream hard-codes "cuda", which turns AMP off on a CPU).
        amp = torch.autocast(device.type, **engine.amp_kwargs) if engine.amp else nullcontext()
        with engine.mode(engine.network), amp:
            # A plain tensor into the network (MetaTensor bookkeeping is per op and trips torch.compile); the
            # prediction gets the image's metadata back for Invertd.
            pred = engine.inferer(image.as_tensor(), engine.network, point_coords=coords, point_labels=labels,
                                  class_vector=class_vector)
        if not isinstance(pred, MetaTensor):
            pred = MetaTensor(pred, meta=image.meta, applied_operations=image.applied_operations)
        reset_ops_id(image)  # Invertd inverts with a deep copy of the preprocessing: transform ids differ
        engine.state.output[Keys.PRED] = pred
        for key, value in zip(PROMPT_KEYS, (class_vector, coords, labels)):
            engine.state.output[key] = None if value is None else value[None]  # batch dimension, for decollate
        engine.fire_event(IterationEvents.FORWARD_COMPLETED)
        engine.fire_event(IterationEvents.MODEL_COMPLETED)
        return engine.state.output


    def _validate(self, engine, batchdata):
        image, label = engine.prepare_batch(batchdata, engine.state.device, engine.non_blocking, **engine.to_kwargs)
        class_vector = torch.as_tensor(label_classes(self.hyper_kwargs), device=image.device).reshape(-1, 1)
        engine.state.output = {Keys.IMAGE: image, Keys.LABEL: label}
        amp = torch.autocast(image.device.type, **engine.amp_kwargs) if engine.amp else nullcontext()
        with engine.mode(engine.network), amp:
            engine.state.output[Keys.PRED] = engine.inferer(image.as_tensor(), engine.network,
                                                            class_vector=class_vector)
        engine.fire_event(IterationEvents.FORWARD_COMPLETED)
        engine.fire_event(IterationEvents.MODEL_COMPLETED)
        return engine.state.output


def label_classes(hyper_kwargs: dict) -> list[int]:
    """The global class ids a dataset's labels 0, 1, ... stand for: `label_set`, or 0 .. output_classes - 1."""
    label_set = hyper_kwargs.get("label_set")
    return list(range(hyper_kwargs["output_classes"])) if label_set is None else list(label_set)


def _item0(value):
    """The first request of a collated batch: the DataLoader turns nested lists into lists of batch-first tensors."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value[0].tolist()
    if isinstance(value, (list, tuple)):
        return [_item0(v) for v in value]
    return value


def _to_preprocessed_voxels(points: torch.Tensor, image: MetaTensor) -> torch.Tensor:
    """[N, 3] voxel coordinates of the stored image -> voxel coordinates of the preprocessed one: through the world
    (original affine), then back with the current affine (spacing, crop and orientation all moved the grid)."""
    original = torch.as_tensor(image.meta["original_affine"][0], dtype=torch.float64)
    current = torch.as_tensor(image.affine[0], dtype=torch.float64).cpu()
    to_current = torch.linalg.inv(current) @ original
    homogeneous = torch.cat([points, torch.ones(len(points), 1, dtype=torch.float64)], dim=1)
    return (homogeneous @ to_current.T)[:, :3]
'''

# The bundle's `scripts/trainer.py`.
_SCRIPTS_TRAINER = '''"""VISTA3D's trainer: each iteration prompts the network with classes and clicks sampled from the labels."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from monai.apps.vista3d.sampler import sample_prompt_pairs
from monai.engines import SupervisedTrainer
from monai.engines.utils import IterationEvents
from monai.utils.enums import CommonKeys as Keys

from scripts.evaluator import label_classes


class Vista3dTrainer(SupervisedTrainer):
    """`hyper_kwargs` as the bundle's train config names them: output_classes, label_set, max_point, max_prompt,
    max_backprompt, max_foreprompt, drop_label_prob, drop_point_prob, exclude_background. Batches of one patch: MONAI's
    prompt sampler takes one label map. Other arguments are SupervisedTrainer's."""

    def __init__(self, *args, hyper_kwargs: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.hyper_kwargs = dict(hyper_kwargs or {})

    def _iteration(self, engine, batchdata):
        if batchdata is None:
            raise ValueError("Must provide batch data for current iteration.")
        image, label = engine.prepare_batch(batchdata, engine.state.device, engine.non_blocking, **engine.to_kwargs)
        h = self.hyper_kwargs
        label_prompt, points, point_labels, prompt_class = sample_prompt_pairs(
            label, label_classes(h), max_prompt=h["max_prompt"], max_foreprompt=h["max_foreprompt"],
            max_backprompt=h["max_backprompt"], max_point=h["max_point"],
            include_background=not h["exclude_background"], drop_label_prob=h["drop_label_prob"],
            drop_point_prob=h["drop_point_prob"])
        engine.state.output = {Keys.IMAGE: image, Keys.LABEL: label}
        if prompt_class is None:  # nothing to prompt in this patch (the sampler leaves skipping to the trainer)
            engine.state.output[Keys.LOSS] = torch.zeros((), device=image.device)
            return engine.state.output
        engine.network.train()
        engine.optimizer.zero_grad(set_to_none=engine.optim_set_to_none)
        # AMP for the device the network runs on, as the evaluator (upstream hard-codes "cuda")
        amp = torch.autocast(image.device.type, **engine.amp_kwargs) if engine.amp else nullcontext()
        with amp:
            logits = engine.network(image.as_tensor(), point_coords=points, point_labels=point_labels,
                                    class_vector=label_prompt)
            engine.fire_event(IterationEvents.FORWARD_COMPLETED)
            # one map per prompt, against its class; prompts of class 0 (background) pad the batch and are not scored.
            # A float target: MONAI's Dice with squared_pred takes the norm of the target, which a bool has none of.
            scored = [i for i, c in enumerate(prompt_class.flatten().tolist()) if c != 0]
            losses = [engine.loss_function(logits[[i]].float(), (label == prompt_class[i]).float()) for i in scored]
            # no scored prompt still gives a loss in the graph, so the step below is the same every iteration
            loss = torch.stack(losses).mean() if losses else logits.sum() * 0.0
        engine.state.output[Keys.LOSS] = loss
        engine.fire_event(IterationEvents.LOSS_COMPLETED)
        if engine.amp and engine.scaler is not None:
            engine.scaler.scale(loss).backward()
            engine.fire_event(IterationEvents.BACKWARD_COMPLETED)
            engine.scaler.step(engine.optimizer)
            engine.scaler.update()
        else:
            loss.backward()
            engine.fire_event(IterationEvents.BACKWARD_COMPLETED)
            engine.optimizer.step()
        engine.fire_event(IterationEvents.MODEL_COMPLETED)
        return engine.state.output
'''


def _network_def(size: str) -> str:
    if size == "full":
        return "$monai.networks.nets.vista3d132(in_channels=@input_channels)"
    return f"$monai.networks.nets.vista3d132(encoder_embed_dim={EMBED_DIM[size]}, in_channels=@input_channels)"


def inference_config(size: str) -> dict:
    """The bundle's configs/inference.json: upstream's layout, keys and transforms, sized by `size`."""
    check_size(size)
    image = "@image_key"
    return {
        "imports": ["$import glob", "$import os", "$import scripts", "$import numpy as np", "$import copy",
                    "$import json", "$import pathlib"],
        "bundle_root": "./",
        "image_key": "image",
        "output_dir": "$@bundle_root + '/eval'",
        "output_ext": ".nii.gz",
        "output_dtype": "$np.float32",
        "output_postfix": "trans",
        "separate_folder": True,
        "input_dict": "${'image': '/data/Task09_Spleen/imagesTr/spleen_10.nii.gz', 'label_prompt': [3]}",
        "everything_labels": "$list(set([i+1 for i in range(132)]) - set([2,16,18,20,21,23,24,25,26,27,128,129,130,"
                             "131,132]))",
        "metadata_path": "$@bundle_root + '/configs/metadata.json'",
        "metadata": "$json.loads(pathlib.Path(@metadata_path).read_text())",
        "labels_dict": "$@metadata['network_data_format']['outputs']['pred']['channel_def']",
        "subclass": {
            "2": [14, 5],
            "20": [28, 29, 30, 31, 32],
            "21": "$list(range(33, 57)) + list(range(63, 98)) + [114, 120, 122]",
        },
        "input_channels": 1,
        "resample_spacing": [1.5, 1.5, 1.5],
        "sw_batch_size": 1,
        "patch_size": PATCH[size],
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "use_point_window": True,
        "network_def": _network_def(size),
        "network": "$@network_def.to(@device)",
        "preprocessing_transforms": [
            {"_target_": "LoadImaged", "keys": image, "image_only": True},
            {"_target_": "EnsureChannelFirstd", "keys": image},
            {"_target_": "EnsureTyped", "keys": image, "device": "@device", "track_meta": True},
            {"_target_": "Spacingd", "keys": image, "pixdim": "@resample_spacing", "mode": "bilinear"},
            {"_target_": "CropForegroundd", "keys": image, "allow_smaller": True, "margin": 10, "source_key": image},
            {"_target_": "monai.apps.vista3d.transforms.VistaPreTransformd", "keys": image, "subclass": "@subclass",
             "labels_dict": "@labels_dict"},
            {"_target_": "ScaleIntensityRanged", "keys": image, "a_min": -963.8247715525971,
             "a_max": 1053.678477684517, "b_min": 0, "b_max": 1, "clip": True},
            {"_target_": "Orientationd", "keys": image, "axcodes": "RAS"},
            {"_target_": "CastToTyped", "keys": image, "dtype": "$torch.float32"},
        ],
        "preprocessing": {"_target_": "Compose", "transforms": "$@preprocessing_transforms "},
        "dataset": {"_target_": "Dataset", "data": "$[@input_dict]", "transform": "@preprocessing"},
        "dataloader": {"_target_": "ThreadDataLoader", "dataset": "@dataset", "batch_size": 1, "shuffle": False,
                       "num_workers": 0},
        "inferer": {"_target_": "scripts.inferer.Vista3dInferer", "roi_size": "@patch_size", "overlap": 0.3,
                    "sw_batch_size": "@sw_batch_size", "use_point_window": "@use_point_window"},
        "postprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "ToDeviced", "keys": "pred", "device": "cpu", "_disabled_": True},
                {"_target_": "monai.apps.vista3d.transforms.VistaPostTransformd", "keys": "pred"},
                {"_target_": "Invertd", "keys": "pred", "transform": "$copy.deepcopy(@preprocessing)",
                 "orig_keys": image, "nearest_interp": True, "to_tensor": True},
                {"_target_": "Lambdad", "func": "$lambda x: torch.nan_to_num(x, nan=255)", "keys": "pred"},
                {"_target_": "SaveImaged", "keys": "pred", "resample": False, "output_dir": "@output_dir",
                 "output_ext": "@output_ext", "output_dtype": "@output_dtype", "output_postfix": "@output_postfix",
                 "separate_folder": "@separate_folder"},
            ],
        },
        "handlers": [{"_target_": "StatsHandler", "iteration_log": False}],
        "checkpointloader": {"_target_": "CheckpointLoader", "load_path": "$@bundle_root + '/models/model.pt'",
                             "load_dict": {"model": "@network"}, "map_location": "@device"},
        "evaluator": {
            "_target_": "scripts.evaluator.Vista3dEvaluator", "device": "@device", "val_data_loader": "@dataloader",
            "network": "@network", "inferer": "@inferer", "postprocessing": "@postprocessing",
            "val_handlers": "@handlers", "amp": True,
            "hyper_kwargs": {"user_prompt": True, "everything_labels": "@everything_labels"},
        },
        "initialize": ["$monai.utils.set_determinism(seed=123)", "$@checkpointloader(@evaluator)"],
        "run": ["$@evaluator.run()"],
    }


def train_config(size: str) -> dict:
    """The bundle's configs/train.json: upstream's layout, keys, transforms, loss, optimiser and schedule, sized by
    `size`."""
    check_size(size)
    full = size == "full"
    workers = 4 if full else TINY_NUM_WORKERS
    both = ["image", "label"]
    loss_output = "$monai.handlers.from_engine(['loss'], first=True)"
    pred_label = "$monai.handlers.from_engine(['pred', 'label'])"
    prompts = {k: f"@{k}" for k in ("output_classes", "max_point", "max_prompt", "max_backprompt", "max_foreprompt",
                                    "drop_label_prob", "drop_point_prob", "exclude_background", "label_set",
                                    "patch_size")}
    return {
        "imports": ["$import glob", "$import os", "$import scripts", "$import ignite", "$import copy"],
        "bundle_root": ".",
        "ckpt_dir": "$@bundle_root + '/models'",
        "output_dir": "$@bundle_root + '/eval'",
        "data_list_file_path": "$@bundle_root + '/configs/msd_task09_spleen_folds.json'",
        "dataset_dir": "/data/Task09_Spleen",
        "use_tensorboard": True,
        "finetune": False,
        "finetune_model_path": "$@bundle_root + '/models/model.pt'",
        "early_stop": False,
        "use_mlflow": False,
        "mlflow_dir": "$@bundle_root + '/mlruns'",
        "fold": 0,
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "epochs": 5,
        "val_interval": 1,
        "val_at_start": False,
        "sw_overlap": 0.625,
        "learning_rate": 0.0001,
        "num_patches_per_image": 1,
        "input_channels": 1,
        "output_classes": 2,
        "max_point": 5,
        "max_prompt": None,
        "max_backprompt": None,
        "max_foreprompt": None,
        "drop_label_prob": 0.25,
        "drop_point_prob": 0.25,
        "exclude_background": True,
        "label_set": None,
        "val_label_set": "@label_set",
        "amp": True,
        "train_datalist": "$monai.auto3dseg.utils.datafold_read(datalist=@data_list_file_path, basedir=@dataset_dir, "
                          "fold=@fold)[0]",
        "val_datalist": "$monai.auto3dseg.utils.datafold_read(datalist=@data_list_file_path, basedir=@dataset_dir, "
                        "fold=@fold)[1]",
        "patch_size": PATCH[size],
        "patch_size_valid": "$@patch_size",
        "network_def": _network_def(size),
        "network": "$@network_def.to(@device)",
        "loss": {"_target_": "DiceCELoss", "include_background": True, "sigmoid": True, "smooth_dr": 1e-05,
                 "smooth_nr": 0, "squared_pred": True, "to_onehot_y": False},
        "optimizer": {"_target_": "torch.optim.AdamW", "params": "$@network.parameters()", "lr": "@learning_rate",
                      "weight_decay": 1e-05},
        "lr_schedule": {
            "activate": True,
            "lr_scheduler": {"_target_": "monai.optimizers.WarmupCosineSchedule", "optimizer": "@optimizer",
                             "t_total": "$@epochs", "warmup_steps": 3, "warmup_multiplier": 0.1},
        },
        "resample_to_spacing": [1.5, 1.5, 1.5],
        "train": {
            "deterministic_transforms": [
                {"_target_": "LoadImaged", "keys": both, "image_only": True, "ensure_channel_first": True},
                {"_target_": "CropForegroundd", "keys": both, "source_key": "image", "margin": 10,
                 "allow_smaller": True, "start_coord_key": None, "end_coord_key": None},
                {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -963.8247715525971,
                 "a_max": 1053.678477684517, "b_min": 0.0, "b_max": 1.0, "clip": True},
                {"_target_": "Orientationd", "keys": both, "axcodes": "RAS"},
                {"_target_": "Spacingd", "keys": both, "pixdim": "$@resample_to_spacing",
                 "mode": ["bilinear", "nearest"]},
                {"_target_": "CastToTyped", "keys": both, "dtype": ["$torch.float32", "$torch.uint8"]},
                {"_target_": "EnsureTyped", "keys": both, "track_meta": True},
                {"_target_": "SpatialPadd", "keys": both, "spatial_size": "@patch_size",
                 "mode": ["constant", "constant"]},
            ],
            "random_transforms": [
                {"_target_": "RandCropByLabelClassesd", "keys": both, "label_key": "label",
                 "num_classes": "@output_classes", "spatial_size": "@patch_size",
                 "num_samples": "@num_patches_per_image", "warn": False},
                {"_target_": "ResizeWithPadOrCropd", "keys": both, "spatial_size": "@patch_size"},
                {"_target_": "RandScaleIntensityd", "keys": "image", "prob": 0.1, "factors": 0.1},
                {"_target_": "RandShiftIntensityd", "keys": "image", "prob": 0.1, "offsets": 0.1},
            ],
            "inferer": {"_target_": "SimpleInferer"},
            "preprocessing": {"_target_": "Compose",
                              "transforms": "$@train#deterministic_transforms + @train#random_transforms"},
            "dataset": {"_target_": "Dataset", "data": "@train_datalist", "transform": "@train#preprocessing"},
            # persistent workers need workers: none at tiny size
            "dataloader": {"_target_": "DataLoader", "dataset": "@train#dataset", "batch_size": 1, "shuffle": True,
                           "num_workers": workers, "pin_memory": True, "persistent_workers": full},
            "handlers": [
                {"_target_": "CheckpointLoader", "_disabled_": "$not @finetune", "load_path": "@finetune_model_path",
                 "load_dict": {"model": "@network"}},
                {"_target_": "LrScheduleHandler", "_disabled_": "$not @lr_schedule#activate",
                 "lr_scheduler": "@lr_schedule#lr_scheduler", "print_lr": True},
                {"_target_": "ValidationHandler", "validator": "@validate#evaluator", "epoch_level": True,
                 "exec_at_start": "@val_at_start", "interval": "@val_interval"},
                {"_target_": "TensorBoardStatsHandler", "_disabled_": "$not @use_tensorboard", "log_dir": "@output_dir",
                 "tag_name": "train_loss", "output_transform": loss_output},
                {"_target_": "StatsHandler", "tag_name": "train_loss", "name": "StatsHandler",
                 "output_transform": loss_output},
                {"_target_": "MLFlowHandler", "_disabled_": "$not @use_mlflow",
                 "tracking_uri": "$os.path.abspath(@mlflow_dir)", "output_transform": loss_output},
            ],
            "key_metric": {"train_accuracy": {"_target_": "ignite.metrics.Accuracy", "output_transform": pred_label}},
            "trainer": {
                "_target_": "scripts.trainer.Vista3dTrainer", "max_epochs": "@epochs", "device": "@device",
                "train_data_loader": "@train#dataloader", "network": "@network", "loss_function": "@loss",
                "optimizer": "@optimizer", "inferer": "@train#inferer", "key_train_metric": None,
                "train_handlers": "@train#handlers", "amp": "@amp",
                "hyper_kwargs": {**prompts, "user_prompt": False},
            },
        },
        "validate": {
            "preprocessing": {"_target_": "Compose", "transforms": "$@train#deterministic_transforms"},
            "postprocessing": {"_target_": "Compose",
                               "transforms": [{"_target_": "AsDiscreted", "keys": "pred", "threshold": 0.0}]},
            "dataset": {"_target_": "Dataset", "data": "$@val_datalist", "transform": "@validate#preprocessing"},
            "dataloader": {"_target_": "DataLoader", "dataset": "@validate#dataset", "batch_size": 1,
                           "shuffle": False, "num_workers": workers},
            "inferer": {"_target_": "scripts.inferer.Vista3dInferer", "roi_size": "@patch_size_valid",
                        "overlap": "@sw_overlap"},
            "handlers": [
                {"_target_": "EarlyStopHandler", "_disabled_": "$not @early_stop", "trainer": None, "patience": 2,
                 "score_function": "$scripts.score_function", "min_delta": 0.01},
                {"_target_": "TensorBoardStatsHandler", "_disabled_": "$not @use_tensorboard", "log_dir": "@output_dir",
                 "iteration_log": False},
                {"_target_": "StatsHandler", "iteration_log": False, "name": "StatsHandler"},
                {"_target_": "CheckpointSaver", "save_dir": "@ckpt_dir", "save_dict": {"model": "@network"},
                 "save_key_metric": True, "key_metric_filename": "model.pt"},
                {"_target_": "MLFlowHandler", "_disabled_": "$not @use_mlflow", "iteration_log": False,
                 "tracking_uri": "$os.path.abspath(@mlflow_dir)"},
            ],
            "key_metric": {"val_mean_dice": {"_target_": "MeanDice", "include_background": False,
                                             "output_transform": pred_label, "num_classes": "@output_classes"}},
            "additional_metrics": {"val_accuracy": {"_target_": "ignite.metrics.Accuracy",
                                                    "output_transform": pred_label}},
            "evaluator": {
                "_target_": "scripts.evaluator.Vista3dEvaluator", "device": "@device",
                "val_data_loader": "@validate#dataloader", "network": "@network", "inferer": "@validate#inferer",
                "postprocessing": "@validate#postprocessing", "key_val_metric": "@validate#key_metric",
                "additional_metrics": None, "val_handlers": "@validate#handlers", "amp": True,
                "hyper_kwargs": {k: f"@{k}" for k in ("output_classes", "drop_label_prob", "drop_point_prob",
                                                      "exclude_background", "label_set")}
                | {"val_head": "auto", "user_prompt": False},
            },
        },
        "initialize": ["$monai.utils.set_determinism(seed=0)"],
        "run": [
            "$@validate#handlers#0.set_trainer(trainer=@train#trainer) if @early_stop else None",
            "$@train#trainer.add_event_handler(ignite.engine.Events.ITERATION_COMPLETED, "
            "ignite.handlers.TerminateOnNan())",
            "$@train#trainer.run()",
        ],
    }


def metadata(size: str) -> dict:
    check_size(size)
    patch = PATCH[size]
    channel_def = {"0": "background", **{str(i): name for i, name in LABELS.items()}}
    return {
        "version": sample_version(UPSTREAM_VERSION, size),
        "monai_version": "1.6.1",
        "name": "VISTA-3D (rocm_zoo sample)",
        "task": "Multi-organ Segmentation in CT Scans with Zero-shot Learning",
        "description": f"rocm_zoo SAMPLE of the Model Zoo vista3d bundle, {size} size "
        f"(vista3d132, encoder_embed_dim {EMBED_DIM[size]}, {'x'.join(map(str, patch))} patches), weights "
        + (TRAINED if size == "tiny" else "untrained (seeded random)") + ". Not a clinical model.",
        "intended_use": "Software testing and benchmarking only. Not for diagnostic use.",
        "data_type": "nibabel",
        "image_classes": "1 channel data, intensity scaled to [0, 1]",
        "label_classes": "single channel data",
        "network_data_format": {
            "inputs": {"image": {"type": "image", "format": "hounsfield", "modality": "CT", "num_channels": 1,
                                 "spatial_shape": patch, "dtype": "float32", "value_range": [0, 1],
                                 "is_patch_data": True, "channel_def": {"0": "image"}}},
            "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": 1,
                                 "spatial_shape": patch, "dtype": "float32", "value_range": [0, 1],
                                 "is_patch_data": True, "channel_def": channel_def}},
        },
    }


def write_files(bundle_dir: Path, size: str) -> None:
    """Configs, docs/labels.json and scripts; weights are written by `rocm_zoo.samples.bundles.write_sample_bundle`."""
    check_size(size)
    bundle_dir = Path(bundle_dir)
    write_json(bundle_dir / "configs" / "inference.json", inference_config(size))
    write_json(bundle_dir / "configs" / "train.json", train_config(size))
    write_json(bundle_dir / "configs" / "metadata.json", metadata(size))
    write_json(bundle_dir / "docs" / "labels.json", {name: i for i, name in LABELS.items()})
    write_text(bundle_dir / "scripts" / "__init__.py", _SCRIPTS_INIT)
    write_text(bundle_dir / "scripts" / "inferer.py", _SCRIPTS_INFERER)
    write_text(bundle_dir / "scripts" / "evaluator.py", _SCRIPTS_EVALUATOR)
    write_text(bundle_dir / "scripts" / "trainer.py", _SCRIPTS_TRAINER)


def build_network(size: str) -> torch.nn.Module:
    """The network exactly as `network_def` builds it."""
    from monai.networks.nets import vista3d132

    check_size(size)
    return vista3d132(encoder_embed_dim=EMBED_DIM[size], in_channels=1)


def random_weights(size: str, seed: int = 0) -> dict[str, dict]:
    """Seeded untrained weights, by file inside the bundle."""
    torch.manual_seed(seed)
    return {"models/model.pt": build_network(size).state_dict()}
