"""Honest sample of the Model Zoo swin_unetr_btcv_segmentation bundle (0.5.6): its inference config, network class and
transforms, at two sizes, with seeded untrained weights. Neither size is a clinical model.

The config keeps upstream's quirk: `network_def` passes `img_size`, which MONAI >= 1.5 rejects with a TypeError, so
the bundle config alone fails here exactly as the real bundle does; the rocm_zoo overlay swaps the `_target_` for
`rocm_zoo.engine.compat.swin_unetr`. `tiny` changes only the size keys: `feature_size` 12 (the smallest SwinUNETR allows: a
multiple of 12) and a 64^3 window (SwinUNETR needs multiples of 32, and at 32^3 its bottleneck is 1 voxel, which
instance norm rejects), with `img_size` following the window as upstream's does, and a 4 mm resampling instead of
1.5 x 1.5 x 2.0 mm (a 64^3 window costs ~3-5 s on two CPU cores; at upstream's spacing a 400 mm field of view is ~190
windows). Everything else is upstream's.

`configs/train.json` mirrors upstream's (`train#...` / `validate#...`, DiceCELoss, Adam, SupervisedTrainer with `amp`,
MeanDice `val_mean_dice`, `initialize` / `run`; upstream has no `finalize` and no learning-rate scheduler), with its
`img_size` and `use_checkpoint: true` (activation checkpointing for training) and the ITKReader. `tiny` sizes it like
the inference config (64^3 crops and window, 4 mm) and loads data without workers or cache (`common.TINY_NUM_WORKERS`).
The training overlay swaps the `_target_` for the same shim as the inference overlay.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rocm_zoo.samples.bundles.common import (TRAINED, TINY_CACHE_RATE, TINY_NUM_WORKERS, check_size, sample_version,
                                             write_json)

NAME = "swin_unetr_btcv_segmentation"
UPSTREAM_VERSION = "0.5.6"
FEATURE_SIZE = {"tiny": 12, "full": 48}
ROI = {"tiny": 64, "full": 96}
PIXDIM = {"tiny": [4.0, 4.0, 4.0], "full": [1.5, 1.5, 2.0]}
SW_BATCH_SIZE = 4
IN_CHANNELS = 1
LABELS = ("background", "spleen", "Right Kidney", "Left Kideny", "Gallbladder", "Esophagus", "Liver", "Stomach",
          "Aorta", "IVC", "Portal and Splenic Veins", "Pancreas", "Right adrenal gland", "Left adrenal gland")


def network_input_shape(size: str) -> tuple[int, ...]:
    """What one sliding-window batch gives the network: (sw_batch_size, in_channels, *roi). The last batch of a volume
    holds the windows left over (1 to 3 of them) unless the window count is a multiple of 4."""
    check_size(size)
    return (SW_BATCH_SIZE, IN_CHANNELS, ROI[size], ROI[size], ROI[size])


def network_def(size: str, use_checkpoint: bool) -> dict:
    """Upstream's inference config does not checkpoint activations, its train config does."""
    check_size(size)
    return {
        "_target_": "SwinUNETR",
        "spatial_dims": 3,
        "img_size": ROI[size],  # upstream's quirk, kept: MONAI >= 1.5 rejects it
        "in_channels": IN_CHANNELS,
        "out_channels": len(LABELS),
        "feature_size": FEATURE_SIZE[size],
        "use_checkpoint": use_checkpoint,
    }


def inference_config(size: str) -> dict:
    """The bundle's configs/inference.json: upstream layout, keys and transforms, sized by `size`."""
    check_size(size)
    image = "@image_key"
    roi = ROI[size]
    return {
        "imports": ["$import glob", "$import numpy", "$import os"],
        "bundle_root": ".",
        "checkpoint": "$@bundle_root + '/models/model.pt'",
        "image_key": "image",
        "output_dir": "$@bundle_root + '/eval'",
        "output_ext": ".nii.gz",
        "output_dtype": "$numpy.float32",
        "output_postfix": "trans",
        "separate_folder": True,
        "load_pretrain": True,
        "dataset_dir": "/workspace/data/RawData/",
        "datalist": "$list(sorted(glob.glob(@dataset_dir + '/imagesTs/*.nii.gz')))",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "network_def": network_def(size, use_checkpoint=False),
        "network": "$@network_def.to(@device)",
        "preprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "LoadImaged", "keys": image, "reader": "ITKReader"},
                {"_target_": "EnsureChannelFirstd", "keys": image},
                {"_target_": "Orientationd", "keys": image, "axcodes": "RAS"},
                {"_target_": "Spacingd", "keys": image, "pixdim": PIXDIM[size], "mode": "bilinear"},
                {"_target_": "ScaleIntensityRanged", "keys": image, "a_min": -175, "a_max": 250,
                 "b_min": 0.0, "b_max": 1.0, "clip": True},
                {"_target_": "EnsureTyped", "keys": image},
            ],
        },
        "dataset": {"_target_": "Dataset", "data": "$[{'image': i} for i in @datalist]", "transform": "@preprocessing"},
        "dataloader": {"_target_": "DataLoader", "dataset": "@dataset", "batch_size": 1, "shuffle": False,
                       "num_workers": 4},
        "inferer": {"_target_": "SlidingWindowInferer", "roi_size": [roi, roi, roi], "sw_batch_size": SW_BATCH_SIZE,
                    "overlap": 0.5},
        "postprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                {"_target_": "Invertd", "keys": "pred", "transform": "@preprocessing", "orig_keys": image,
                 "nearest_interp": False, "to_tensor": True},
                {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
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
        "checkpointloader": {"_target_": "CheckpointLoader", "load_path": "$@checkpoint",
                             "load_dict": {"model": "@network"}},
        "initialize": ["$monai.utils.set_determinism(seed=123)",
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
    loss_output = "$monai.handlers.from_engine(['loss'], first=True)"
    pred_label = "$monai.handlers.from_engine(['pred', 'label'])"
    flips = [{"_target_": "RandFlipd", "keys": both, "spatial_axis": [axis], "prob": 0.1} for axis in range(3)]
    return {
        "imports": ["$import glob", "$import os", "$import ignite"],
        "bundle_root": ".",
        "ckpt_dir": "$@bundle_root + '/models'",
        "output_dir": "$@bundle_root + '/eval'",
        "dataset_dir": "/workspace/data/RawData/",
        "images": "$list(sorted(glob.glob(@dataset_dir + '/imagesTr/*.nii.gz')))",
        "labels": "$list(sorted(glob.glob(@dataset_dir + '/labelsTr/*.nii.gz')))",
        "val_interval": 5,
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "network_def": network_def(size, use_checkpoint=True),
        "network": "$@network_def.to(@device)",
        "loss": {"_target_": "DiceCELoss", "to_onehot_y": True, "softmax": True, "squared_pred": True, "batch": True},
        "optimizer": {"_target_": "torch.optim.Adam", "params": "$@network.parameters()", "lr": 0.0002},
        "train": {
            "deterministic_transforms": [
                {"_target_": "LoadImaged", "keys": both, "reader": "ITKReader"},
                {"_target_": "EnsureChannelFirstd", "keys": both},
                {"_target_": "Orientationd", "keys": both, "axcodes": "RAS"},
                {"_target_": "Spacingd", "keys": both, "pixdim": PIXDIM[size], "mode": ["bilinear", "nearest"]},
                {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -175, "a_max": 250, "b_min": 0.0,
                 "b_max": 1.0, "clip": True},
                {"_target_": "EnsureTyped", "keys": both},
            ],
            "random_transforms": [
                {"_target_": "RandCropByPosNegLabeld", "keys": both, "label_key": "label", "spatial_size": roi,
                 "pos": 1, "neg": 1, "num_samples": 2, "image_key": "image", "image_threshold": 0},
                *flips,
                {"_target_": "RandRotate90d", "keys": both, "max_k": 3, "prob": 0.1},
                {"_target_": "RandShiftIntensityd", "keys": "image", "offsets": 0.1, "prob": 0.5},
            ],
            "preprocessing": {"_target_": "Compose",
                              "transforms": "$@train#deterministic_transforms + @train#random_transforms"},
            "dataset": {"_target_": "CacheDataset",
                        "data": "$[{'image': i, 'label': l} for i, l in zip(@images[:-9], @labels[:-9])]",
                        "transform": "@train#preprocessing", "cache_rate": 1.0 if full else TINY_CACHE_RATE,
                        "num_workers": workers},
            "dataloader": {"_target_": "DataLoader", "dataset": "@train#dataset", "batch_size": 2, "shuffle": True,
                           "num_workers": workers},
            "inferer": {"_target_": "SimpleInferer"},
            "postprocessing": {
                "_target_": "Compose",
                "transforms": [
                    {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                    {"_target_": "AsDiscreted", "keys": ["pred", "label"], "argmax": [True, False],
                     "to_onehot": len(LABELS)},
                ],
            },
            "handlers": [
                {"_target_": "ValidationHandler", "validator": "@validate#evaluator", "epoch_level": True,
                 "interval": "@val_interval"},
                {"_target_": "StatsHandler", "tag_name": "train_loss", "output_transform": loss_output},
                {"_target_": "TensorBoardStatsHandler", "log_dir": "@output_dir", "tag_name": "train_loss",
                 "output_transform": loss_output},
            ],
            "key_metric": {"train_accuracy": {"_target_": "ignite.metrics.Accuracy", "output_transform": pred_label}},
            "trainer": {
                "_target_": "SupervisedTrainer", "max_epochs": 500, "device": "@device",
                "train_data_loader": "@train#dataloader", "network": "@network", "loss_function": "@loss",
                "optimizer": "@optimizer", "inferer": "@train#inferer", "postprocessing": "@train#postprocessing",
                "key_train_metric": "@train#key_metric", "train_handlers": "@train#handlers", "amp": True,
            },
        },
        "validate": {
            "preprocessing": {"_target_": "Compose", "transforms": "%train#deterministic_transforms"},
            "dataset": {"_target_": "CacheDataset",
                        "data": "$[{'image': i, 'label': l} for i, l in zip(@images[-9:], @labels[-9:])]",
                        "transform": "@validate#preprocessing", "cache_rate": 1.0 if full else TINY_CACHE_RATE},
            "dataloader": {"_target_": "DataLoader", "dataset": "@validate#dataset", "batch_size": 1,
                           "shuffle": False, "num_workers": workers},
            "inferer": {"_target_": "SlidingWindowInferer", "roi_size": roi, "sw_batch_size": 2, "overlap": 0.25},
            "postprocessing": "%train#postprocessing",
            "handlers": [
                {"_target_": "StatsHandler", "iteration_log": False},
                {"_target_": "TensorBoardStatsHandler", "log_dir": "@output_dir", "iteration_log": False},
                {"_target_": "CheckpointSaver", "save_dir": "@ckpt_dir", "save_dict": {"model": "@network"},
                 "save_key_metric": True, "key_metric_filename": "model.pt"},
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
        "initialize": ["$monai.utils.set_determinism(seed=123)"],
        "run": ["$@train#trainer.run()"],
    }


def metadata(size: str) -> dict:
    check_size(size)
    roi = [ROI[size]] * 3
    channels = {str(i): name for i, name in enumerate(LABELS)}
    return {
        "version": sample_version(UPSTREAM_VERSION, size),
        "name": "Swin UNETR BTCV segmentation (rocm_zoo sample)",
        "task": "BTCV multi-organ segmentation",
        "description": f"rocm_zoo SAMPLE of the Model Zoo swin_unetr_btcv_segmentation bundle, {size} size, "
        + (f"weights {TRAINED}" if size == "tiny" else "untrained seeded random weights") + ". Not a clinical model.",
        "intended_use": "Software testing and benchmarking only. Not for diagnostic use.",
        "network_data_format": {
            "inputs": {"image": {"type": "image", "format": "hounsfield", "modality": "CT", "num_channels": IN_CHANNELS,
                                 "spatial_shape": roi, "dtype": "float32", "value_range": [0, 1],
                                 "is_patch_data": True, "channel_def": {"0": "image"}}},
            "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": len(LABELS),
                                 "spatial_shape": roi, "dtype": "float32", "value_range": [0, 1],
                                 "is_patch_data": True, "channel_def": channels}},
        },
    }


def write_files(bundle_dir: Path, size: str) -> None:
    """Configs only (upstream's config imports no `scripts`); weights come from `write_sample_bundle`."""
    check_size(size)
    write_json(bundle_dir / "configs" / "inference.json", inference_config(size))
    write_json(bundle_dir / "configs" / "train.json", train_config(size))
    write_json(bundle_dir / "configs" / "metadata.json", metadata(size))


def build_network(size: str) -> torch.nn.Module:
    """The network the config builds, through the same shim the overlay uses (the config's own `img_size` fails)."""
    from rocm_zoo.engine.compat import swin_unetr

    cfg = inference_config(size)["network_def"]
    return swin_unetr(**{k: v for k, v in cfg.items() if k != "_target_"})


def random_weights(size: str, seed: int = 0) -> dict[str, dict]:
    """Seeded untrained weights, by file inside the bundle."""
    torch.manual_seed(seed)
    return {"models/model.pt": build_network(size).state_dict()}
