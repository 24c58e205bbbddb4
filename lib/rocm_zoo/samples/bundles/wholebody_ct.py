"""Honest sample of the Model Zoo wholeBody_ct_segmentation bundle (0.2.5): its inference config, network class and
transforms, at two sizes, with seeded untrained weights. Neither size is a clinical model.

Upstream ships two checkpoints of one SegResNet: `models/model.pt` (trained at 1.5 mm) and `models/model_lowres.pt`
(3.0 mm); `displayable_configs#highres` picks both the spacing and the file (`--displayable_configs#highres False` on
the command line: `false` in lower case reaches the config as a truthy string). The sample writes both, from
different seeds. `tiny` changes only the size keys: `init_filters` 8, a 48^3 window, and 4 / 6 mm resampling instead
of 1.5 / 3.0 mm (a window costs ~1.2 s on two CPU cores; at 1.5 mm a 400 mm field of view is ~250 windows).
Everything else is upstream's.

`configs/train.json` mirrors upstream's (`train#...` / `validate#...`, DiceCELoss, AdamW, SupervisedTrainer with
`amp`, MeanDice `val_mean_dice`, `initialize` / `run`; upstream has no `finalize` and no learning-rate scheduler).
`tiny` sizes it like the inference config (48^3 crops, `k_divisible` 48, a 48^3 validation centre crop (one window) for
upstream's 160^3) and loads data without workers or cache (`common.TINY_NUM_WORKERS`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rocm_zoo.samples.bundles.common import (TRAINED, TINY_CACHE_RATE, TINY_NUM_WORKERS, check_size, sample_version,
                                             write_json)

NAME = "wholeBody_ct_segmentation"
UPSTREAM_VERSION = "0.2.5"
INIT_FILTERS = {"tiny": 8, "full": 32}
ROI = {"tiny": 48, "full": 96}
PIXDIM = {  # highres else lowres
    "tiny": "$[4.0, 4.0, 4.0] if @displayable_configs#highres else [6.0, 6.0, 6.0]",
    "full": "$[1.5, 1.5, 1.5] if @displayable_configs#highres else [3.0, 3.0, 3.0]",
}
VAL_CROP = {"tiny": 48, "full": 160}  # train.json's validation centre crop, in voxels; tiny: one window
SW_BATCH_SIZE = 1
IN_CHANNELS = 1
WEIGHT_FILES = ("models/model.pt", "models/model_lowres.pt")  # highres (1.5 mm), lowres (3.0 mm)

_SIDES = ("left", "right")
LABELS = (
    "background", "spleen", "kidney_right", "kidney_left", "gallbladder", "liver", "stomach", "aorta",
    "inferior_vena_cava", "portal_vein_and_splenic_vein", "pancreas", "adrenal_gland_right", "adrenal_gland_left",
    "lung_upper_lobe_left", "lung_lower_lobe_left", "lung_upper_lobe_right", "lung_middle_lobe_right",
    "lung_lower_lobe_right",
    *(f"vertebrae_L{i}" for i in range(5, 0, -1)), *(f"vertebrae_T{i}" for i in range(12, 0, -1)),
    *(f"vertebrae_C{i}" for i in range(7, 0, -1)),
    "esophagus", "trachea", "heart_myocardium", "heart_atrium_left", "heart_ventricle_left", "heart_atrium_right",
    "heart_ventricle_right", "pulmonary_artery", "brain", "iliac_artery_left", "iliac_artery_right", "iliac_vena_left",
    "iliac_vena_right", "small_bowel", "duodenum", "colon",
    *(f"rib_{side}_{i}" for side in _SIDES for i in range(1, 13)),
    *(f"{bone}_{side}" for bone in ("humerus", "scapula", "clavicula", "femur", "hip") for side in _SIDES),
    "sacrum", "face",
    *(f"gluteus_{part}_{side}" for part in ("maximus", "medius", "minimus") for side in _SIDES),
    *(f"{muscle}_{side}" for muscle in ("autochthon", "iliopsoas") for side in _SIDES),
    "urinary_bladder",
)


def network_input_shape(size: str) -> tuple[int, ...]:
    """What one sliding-window batch gives the network: (sw_batch_size, in_channels, *roi); batch 1, so every batch."""
    check_size(size)
    return (SW_BATCH_SIZE, IN_CHANNELS, ROI[size], ROI[size], ROI[size])


def network_def(size: str) -> dict:
    check_size(size)
    return {
        "_target_": "SegResNet",
        "spatial_dims": 3,
        "in_channels": IN_CHANNELS,
        "out_channels": len(LABELS),
        "init_filters": INIT_FILTERS[size],
        "blocks_down": [1, 2, 2, 4],
        "blocks_up": [1, 1, 1],
        "dropout_prob": 0.2,
    }


def inference_config(size: str) -> dict:
    """The bundle's configs/inference.json: upstream layout, keys and transforms, sized by `size`."""
    check_size(size)
    image = "@image_key"
    roi = ROI[size]
    device = "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')"
    return {
        "displayable_configs": {"highres": True, "sw_overlap": 0.25, "sw_batch_size": SW_BATCH_SIZE},
        "imports": ["$import glob", "$import numpy", "$import os"],
        "bundle_root": ".",
        "image_key": "image",
        "output_dir": "$@bundle_root + '/eval'",
        "output_ext": ".nii.gz",
        "output_dtype": "$numpy.float32",
        "output_postfix": "trans",
        "separate_folder": True,
        "load_pretrain": True,
        "dataset_dir": "sampledata",
        "datalist": "$list(sorted(glob.glob(@dataset_dir + '/imagesTs/*.nii.gz')))",
        "device": device,
        "pixdim": PIXDIM[size],
        "modelname": "$'model.pt' if @displayable_configs#highres else 'model_lowres.pt'",
        "network_def": network_def(size),
        "network": "$@network_def.to(@device)",
        "preprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "LoadImaged", "keys": image},
                {"_target_": "EnsureTyped", "keys": image},
                {"_target_": "EnsureChannelFirstd", "keys": image},
                {"_target_": "Orientationd", "keys": image, "axcodes": "RAS"},
                {"_target_": "Spacingd", "keys": image, "pixdim": "@pixdim", "mode": "bilinear"},
                {"_target_": "NormalizeIntensityd", "keys": image, "nonzero": True},
                {"_target_": "ScaleIntensityd", "keys": image, "minv": -1.0, "maxv": 1.0},
            ],
        },
        "dataset": {"_target_": "Dataset", "data": "$[{'image': i} for i in @datalist]", "transform": "@preprocessing"},
        "dataloader": {"_target_": "DataLoader", "dataset": "@dataset", "batch_size": 1, "shuffle": False,
                       "num_workers": 1},
        "inferer": {
            "_target_": "SlidingWindowInferer",
            "roi_size": [roi, roi, roi],
            "sw_batch_size": "@displayable_configs#sw_batch_size",
            "overlap": "@displayable_configs#sw_overlap",
            "padding_mode": "replicate",
            "mode": "gaussian",
            "device": device,
        },
        "postprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
                {"_target_": "Invertd", "keys": "pred", "transform": "@preprocessing", "orig_keys": image,
                 "nearest_interp": True, "to_tensor": True},
                {"_target_": "SaveImaged", "keys": "pred", "output_dir": "@output_dir", "output_ext": "@output_ext",
                 "output_dtype": "@output_dtype", "output_postfix": "@output_postfix",
                 "separate_folder": "@separate_folder"},
            ],
        },
        "handlers": [{"_target_": "StatsHandler", "iteration_log": False}],
        "evaluator": {
            "_target_": "SupervisedEvaluator", "device": "@device", "val_data_loader": "@dataloader",
            "network": "@network", "inferer": "@inferer", "postprocessing": "@postprocessing",
            "val_handlers": "@handlers", "amp": True,
        },
        "checkpointloader": {"_target_": "CheckpointLoader", "load_path": "$@bundle_root + '/models/' + @modelname",
                             "load_dict": {"model": "@network"}},
        "initialize": ["$setattr(torch.backends.cudnn, 'benchmark', True)",
                       "$@checkpointloader(@evaluator) if @load_pretrain else None"],
        "run": ["$@evaluator.run()"],
    }


def train_config(size: str) -> dict:
    """The bundle's configs/train.json: upstream layout, keys, transforms, loss and optimiser, sized by `size`."""
    check_size(size)
    both = ["image", "label"]
    roi = [ROI[size]] * 3
    full = size == "full"
    workers = 4 if full else TINY_NUM_WORKERS
    loaded = [
        {"_target_": "LoadImaged", "keys": both},
        {"_target_": "EnsureChannelFirstd", "keys": both},
        {"_target_": "EnsureTyped", "keys": both},
        {"_target_": "Orientationd", "keys": both, "axcodes": "RAS"},
        {"_target_": "Spacingd", "keys": both, "pixdim": "@pixdim", "mode": ["bilinear", "nearest"]},
        {"_target_": "NormalizeIntensityd", "keys": "image", "nonzero": True},
        {"_target_": "CropForegroundd", "keys": both, "source_key": "image", "margin": 10, "k_divisible": roi},
        {"_target_": "GaussianSmoothd", "keys": ["image"], "sigma": 0.4},
        {"_target_": "ScaleIntensityd", "keys": "image", "minv": -1.0, "maxv": 1.0},
    ]
    postprocessing = {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "Activationsd", "keys": "pred", "softmax": True},
            {"_target_": "AsDiscreted", "keys": ["pred", "label"], "argmax": [True, False], "to_onehot": len(LABELS)},
        ],
    }
    loss_output = "$monai.handlers.from_engine(['loss'], first=True)"
    pred_label = "$monai.handlers.from_engine(['pred', 'label'])"
    return {
        "displayable_configs": {"highres": True, "init_LR": 0.0001},
        "imports": ["$import glob", "$import os", "$import ignite"],
        "bundle_root": ".",
        "ckpt_dir": "$@bundle_root + '/models'",
        "output_dir": "$@bundle_root + '/eval'",
        "dataset_dir": "sampledata",
        "images": "$list(sorted(glob.glob(@dataset_dir + '/imagesTr/*.nii.gz')))",
        "labels": "$list(sorted(glob.glob(@dataset_dir + '/labelsTr/*.nii.gz')))",
        "highres": True,
        "val_interval": 20,
        "init_LR": 0.0001,
        "batch_size": 4,
        "pixdim": PIXDIM[size],
        "modelname": "$'model.pt' if @displayable_configs#highres else 'model_lowres.pt'",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "network_def": network_def(size),
        "network": "$@network_def.to(@device)",
        "loss": {"_target_": "DiceCELoss", "to_onehot_y": True, "softmax": True},
        "optimizer": {"_target_": "torch.optim.AdamW", "params": "$@network.parameters()",
                      "lr": "@displayable_configs#init_LR", "weight_decay": 1e-05},
        "train": {
            "deterministic_transforms": [*loaded, {"_target_": "EnsureTyped", "keys": both}],
            "random_transforms": [{"_target_": "RandSpatialCropd", "keys": both, "roi_size": roi,
                                   "random_size": False}],
            "preprocessing": {"_target_": "Compose",
                              "transforms": "$@train#deterministic_transforms + @train#random_transforms"},
            "dataset": {"_target_": "CacheDataset",
                        "data": "$[{'image': i, 'label': l} for i, l in zip(@images[:-10], @labels[:-10])]",
                        "transform": "@train#preprocessing", "cache_rate": 0.4 if full else TINY_CACHE_RATE,
                        "num_workers": workers},
            "dataloader": {"_target_": "DataLoader", "dataset": "@train#dataset", "batch_size": "@batch_size",
                           "shuffle": True, "num_workers": workers},
            "inferer": {"_target_": "SimpleInferer"},
            "postprocessing": postprocessing,
            "handlers": [
                {"_target_": "ValidationHandler", "validator": "@validate#evaluator", "epoch_level": True,
                 "interval": "@val_interval"},
                {"_target_": "StatsHandler", "tag_name": "train_loss", "output_transform": loss_output},
                {"_target_": "TensorBoardStatsHandler", "log_dir": "@output_dir", "tag_name": "train_loss",
                 "output_transform": loss_output},
            ],
            "key_metric": {"train_accuracy": {"_target_": "ignite.metrics.Accuracy", "output_transform": pred_label}},
            "trainer": {
                "_target_": "SupervisedTrainer", "max_epochs": 4000, "device": "@device",
                "train_data_loader": "@train#dataloader", "network": "@network", "loss_function": "@loss",
                "optimizer": "@optimizer", "inferer": "@train#inferer", "postprocessing": "@train#postprocessing",
                "key_train_metric": "@train#key_metric", "train_handlers": "@train#handlers", "amp": True,
            },
        },
        "validate": {
            "preprocessing": {"_target_": "Compose", "transforms": [
                *loaded, {"_target_": "CenterSpatialCropd", "keys": both, "roi_size": [VAL_CROP[size]] * 3}]},
            "postprocessing": postprocessing,
            "dataset": {"_target_": "Dataset",
                        "data": "$[{'image': i, 'label': l} for i, l in zip(@images[-10:], @labels[-10:])]",
                        "transform": "@validate#preprocessing"},
            "dataloader": {"_target_": "DataLoader", "dataset": "@validate#dataset", "batch_size": 1,
                           "shuffle": False, "num_workers": workers},
            "inferer": {"_target_": "SlidingWindowInferer", "roi_size": roi, "sw_batch_size": 1, "overlap": 0.25},
            "handlers": [
                {"_target_": "StatsHandler", "iteration_log": False},
                {"_target_": "TensorBoardStatsHandler", "log_dir": "@output_dir", "iteration_log": False},
                {"_target_": "CheckpointSaver", "save_dir": "@ckpt_dir", "save_dict": {"model": "@network"},
                 "save_key_metric": True, "key_metric_filename": "@modelname"},
            ],
            "key_metric": {"val_mean_dice": {"_target_": "MeanDice", "include_background": False,
                                             "output_transform": pred_label}},
            "additional_metrics": {"val_accuracy": {"_target_": "ignite.metrics.Accuracy",
                                                    "output_transform": pred_label}},
            "evaluator": {
                "_target_": "SupervisedEvaluator", "device": "@device", "val_data_loader": "@validate#dataloader",
                "network": "@network", "inferer": "@validate#inferer", "postprocessing": "@validate#postprocessing",
                "key_val_metric": "@validate#key_metric", "additional_metrics": "@validate#additional_metrics",
                "val_handlers": "@validate#handlers", "amp": True,
            },
        },
        "initialize": ["$monai.utils.set_determinism(seed=123)", "$setattr(torch.backends.cudnn, 'benchmark', True)"],
        "run": ["$@train#trainer.run()"],
    }


def metadata(size: str) -> dict:
    check_size(size)
    roi = [ROI[size]] * 3
    return {
        "version": sample_version(UPSTREAM_VERSION, size),
        "name": "Whole body CT segmentation (rocm_zoo sample)",
        "task": "TotalSegmentator Segmentation",
        "description": f"rocm_zoo SAMPLE of the Model Zoo wholeBody_ct_segmentation bundle, {size} size, "
        + (f"model.pt {TRAINED}, model_lowres.pt untrained (seeded random)" if size == "tiny" else
           "untrained seeded random weights (model.pt and model_lowres.pt)") + ". Not a clinical model.",
        "intended_use": "Software testing and benchmarking only. Not for diagnostic use.",
        "network_data_format": {
            "inputs": {"image": {"type": "image", "format": "hounsfield", "modality": "CT", "num_channels": IN_CHANNELS,
                                 "spatial_shape": roi, "dtype": "float32", "value_range": [0, 1],
                                 "is_patch_data": True, "channel_def": {"0": "image"}}},
            "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": len(LABELS),
                                 "spatial_shape": roi, "dtype": "float32", "value_range": [0, len(LABELS) - 1],
                                 "is_patch_data": True,
                                 "channel_def": {str(i): name for i, name in enumerate(LABELS)}}},
        },
    }


def write_files(bundle_dir: Path, size: str) -> None:
    """Configs only (upstream's config imports no `scripts`); weights come from `write_sample_bundle`."""
    check_size(size)
    write_json(bundle_dir / "configs" / "inference.json", inference_config(size))
    write_json(bundle_dir / "configs" / "train.json", train_config(size))
    write_json(bundle_dir / "configs" / "metadata.json", metadata(size))


def build_network(size: str) -> torch.nn.Module:
    from monai.networks.nets import SegResNet

    cfg = network_def(size)
    return SegResNet(**{k: v for k, v in cfg.items() if k != "_target_"})


def random_weights(size: str, seed: int = 0) -> dict[str, dict]:
    """Seeded untrained weights for both upstream checkpoints, from different seeds (two separately trained models
    upstream), by file inside the bundle."""
    weights = {}
    for i, rel in enumerate(WEIGHT_FILES):
        torch.manual_seed(seed + i)
        weights[rel] = build_network(size).state_dict()
    return weights
