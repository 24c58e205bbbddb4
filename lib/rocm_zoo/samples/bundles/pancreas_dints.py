"""Honest sample of the Model Zoo bundle pancreas_ct_dints_segmentation: its configs/inference.yaml layout and keys,
its transforms, its sliding-window inferer and its DiNTS network, at two sizes.

The bundle's architecture is searched, not fixed: `models/search_code_18590.pt` holds the decoded search result
(numpy arrays `node_a`, `arch_code_a`, `arch_code_c`, ...) and the config builds `DiNTS(TopologyInstance(...))` from
it. No search is run here: the sample's code is a seeded `TopologySearch` decoded with MONAI's own decoder, so it is
a valid but arbitrary architecture. As upstream, the file is pickled numpy and the config reads it with a plain
`torch.load`, which fails under torch >= 2.6 (`weights_only=True` by default); the rocm_zoo overlay fixes that.

`full` has the bundle's real sizes (96^3 patches, 1 mm voxels, channel_mul 1, 12 blocks); `tiny` changes only the
size keys (channel_mul, num_blocks, patch size, voxel spacing) so a CPU runs a ~400 mm phantom in seconds. Weights are
untrained (seeded random) at both sizes. Neither is a clinical model.

`configs/train.yaml` mirrors upstream's: DiNTS built from the same searched architecture code, DiceCELoss, SGD with a
StepLR `lr_scheduler` (stepped by `train#handlers`' LrScheduleHandler), the `label4crop` dilation that
RandCropByLabelClassesd samples from, SupervisedTrainer with `amp`, MeanDice `val_mean_dice`, `initialize` / `run`
(upstream has no `finalize`). Its quirks are upstream's too (plain `torch.load` of the architecture code, a CUDA
`dints_space#device`); the training overlay fixes them as the inference overlay does. `tiny` sizes it like the
inference config (64^3 patches, 4 mm, the dilation half a patch: 32 voxels for upstream's 48) and loads data without
workers or cache (`common.TINY_NUM_WORKERS`).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles.common import (TRAINED, TINY_CACHE_RATE, TINY_NUM_WORKERS, check_size, sample_version,
                                             write_json, write_text, write_torch)

NAME = "pancreas_ct_dints_segmentation"
UPSTREAM_VERSION = "0.5.0"
CONFIG_FILE = "configs/inference.yaml"
TRAIN_CONFIG_FILE = "configs/train.yaml"
ARCH_FILE = "models/search_code_18590.pt"
NUM_DEPTHS = 4  # both sizes: patches must be multiples of 2 ** (NUM_DEPTHS + 1) = 32
IN_CHANNELS, NUM_CLASSES = 1, 3
ARCH_SEED = 0  # the architecture is part of the bundle, not of its weights: one fixed seed


@dataclass(frozen=True)
class DintsSize:
    channel_mul: float
    num_blocks: int
    roi: int
    pixdim: float
    sw_batch_size: int = 4


SIZES = {
    "full": DintsSize(channel_mul=1, num_blocks=12, roi=96, pixdim=1),
    # 4 mm voxels: at the bundle's 1 mm a 400 x 400 x 200 mm phantom becomes 32 M voxels (~600 windows of 96^3),
    # minutes on a CPU even for a small network; at 4 mm it is 100 x 100 x 50, 9 windows of 64^3 (256 mm each,
    # upstream 96 mm). DiNTS needs patch sides that are multiples of 32 (2 ** (num_depths + 1)).
    "tiny": DintsSize(channel_mul=0.125, num_blocks=4, roi=64, pixdim=4),
}


def _size(size: str) -> DintsSize:
    check_size(size)
    return SIZES[size]


def network_input_shape(size: str) -> tuple[int, ...]:
    """What one sliding-window batch gives the network: (sw_batch_size, in_channels, *roi)."""
    s = _size(size)
    return (s.sw_batch_size, IN_CHANNELS, s.roi, s.roi, s.roi)


def arch_code(size: str, seed: int = ARCH_SEED) -> dict:
    """The content of `models/search_code_18590.pt`, keyed as the bundle's search script saves it.

    MONAI's `TopologySearch.decode()` (Dijkstra over feasible path activations) turns seeded architecture logits
    into a valid code. Decoding reads only the logits, so the search space is built at the narrowest width; the
    global torch RNG is left untouched."""
    return copy.deepcopy(_arch_code(size, seed))


@functools.lru_cache(maxsize=4)  # decoding takes ~10 s of CPU; callers get copies
def _arch_code(size: str, seed: int) -> dict:
    from monai.networks.nets import TopologySearch

    s = _size(size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        space = TopologySearch(channel_mul=1 / 32, num_blocks=s.num_blocks, num_depths=NUM_DEPTHS,
                               use_downsample=True, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        space.log_alpha_a.copy_(torch.randn(space.log_alpha_a.shape, generator=gen))
        space.log_alpha_c.copy_(torch.randn(space.log_alpha_c.shape, generator=gen))
    node_a, arch_code_a, arch_code_c, arch_code_a_max = space.decode()
    return {
        "node_a": np.asarray(node_a),
        "arch_code_a": np.asarray(arch_code_a),
        "arch_code_a_max": np.asarray(arch_code_a_max),
        "arch_code_c": np.asarray(arch_code_c),
        # search progress, as upstream records it; no search was run for the sample
        "iter_num": 0,
        "epochs": 0,
        "best_dsc": math.nan,
        "best_path": 0,
    }


def _dints_space(s: DintsSize) -> dict:
    """The searched space as both upstream configs (inference and train) declare it."""
    return {
        "_target_": "monai.networks.nets.TopologyInstance",
        "channel_mul": s.channel_mul,
        "num_blocks": s.num_blocks,
        "num_depths": NUM_DEPTHS,
        "use_downsample": True,
        "arch_code": ["$@arch_ckpt['arch_code_a']", "$@arch_ckpt['arch_code_c']"],
        "device": "$torch.device('cuda')",
    }


def inference_config(size: str) -> dict:
    """The bundle's configs/inference.yaml: the Model Zoo layout, keys and transforms, sized by `size`."""
    s = _size(size)
    image = "@image_key"
    return {
        "imports": ["$import glob", "$import numpy", "$import os"],
        "input_channels": IN_CHANNELS,
        "output_classes": NUM_CLASSES,
        "arch_ckpt_path": f"$@bundle_root + '/{ARCH_FILE}'",
        # upstream as shipped: plain torch.load (weights_only=True on torch >= 2.6) and a hard-coded CUDA device
        "arch_ckpt": "$torch.load(@arch_ckpt_path, map_location=torch.device('cuda'))",
        "bundle_root": ".",
        "image_key": "image",
        "output_dir": "$@bundle_root + '/eval'",
        "output_ext": ".nii.gz",
        "output_dtype": "$numpy.float32",
        "output_postfix": "trans",
        "separate_folder": True,
        "load_pretrain": True,
        "dataset_dir": "/workspace/data/msd/Task07_Pancreas",
        "data_list_file_path": "$@bundle_root + '/configs/dataset_0.json'",
        "datalist": "$monai.data.load_decathlon_datalist(@data_list_file_path, data_list_key='testing', "
                    "base_dir=@dataset_dir)",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "dints_space": _dints_space(s),
        "network_def": {
            "_target_": "monai.networks.nets.DiNTS",
            "dints_space": "@dints_space",
            "in_channels": "@input_channels",
            "num_classes": "@output_classes",
            "use_downsample": True,
            "node_a": "$torch.from_numpy(@arch_ckpt['node_a'])",
        },
        "network": "$@network_def.to(@device)",
        "preprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "LoadImaged", "keys": image},
                {"_target_": "EnsureChannelFirstd", "keys": image},
                {"_target_": "Orientationd", "keys": image, "axcodes": "RAS"},
                {"_target_": "Spacingd", "keys": image, "pixdim": [s.pixdim] * 3, "mode": "bilinear"},
                {"_target_": "ScaleIntensityRanged", "keys": image, "a_min": -87, "a_max": 199, "b_min": 0,
                 "b_max": 1, "clip": True},
                {"_target_": "EnsureTyped", "keys": image},
            ],
        },
        "dataset": {"_target_": "Dataset", "data": "@datalist", "transform": "@preprocessing"},
        "dataloader": {"_target_": "DataLoader", "dataset": "@dataset", "batch_size": 1, "shuffle": False,
                       "num_workers": 4},
        "inferer": {"_target_": "SlidingWindowInferer", "roi_size": [s.roi] * 3, "sw_batch_size": s.sw_batch_size,
                    "overlap": 0.625},
        "postprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                {"_target_": "Invertd", "keys": "pred", "transform": "@preprocessing", "orig_keys": image,
                 "meta_key_postfix": "meta_dict", "nearest_interp": False, "to_tensor": True},
                {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
                {"_target_": "SaveImaged", "keys": "pred", "meta_keys": "pred_meta_dict", "output_dir": "@output_dir",
                 "output_ext": "@output_ext", "output_dtype": "@output_dtype", "output_postfix": "@output_postfix",
                 "separate_folder": "@separate_folder"},
            ],
        },
        "handlers": [{"_target_": "StatsHandler", "iteration_log": False}],
        "evaluator": {
            "_target_": "SupervisedEvaluator", "device": "@device", "val_data_loader": "@dataloader",
            "network": "@network", "inferer": "@inferer", "postprocessing": "@postprocessing",
            "val_handlers": "@handlers", "amp": True,
        },
        "checkpointloader": {"_target_": "CheckpointLoader", "load_path": "$@bundle_root + '/models/model.pt'",
                             "load_dict": {"model": "@network"}},
        "initialize": ["$setattr(torch.backends.cudnn, 'benchmark', True)",
                       "$@checkpointloader(@evaluator) if @load_pretrain else None"],
        "run": ["$@evaluator.run()"],
    }


def train_config(size: str) -> dict:
    """The bundle's configs/train.yaml: the Model Zoo layout, keys, transforms, loss, optimiser and scheduler, sized by
    `size`."""
    s = _size(size)
    full = size == "full"
    workers = 4 if full else TINY_NUM_WORKERS
    cache_rate = 0.125 if full else TINY_CACHE_RATE
    both = ["@image_key", "@label_key"]
    roi = [s.roi] * 3
    loss_output = "$monai.handlers.from_engine(['loss'], first=True)"
    pred_label = "$monai.handlers.from_engine(['pred', 'label'])"
    # one channel per class, each label dilated by half a patch: crops centred anywhere in it still hold the class
    dilate = ("$lambda x, s=@output_classes: np.concatenate(tuple([ndimage.binary_dilation((x==_k).astype(x.dtype), "
              f"iterations={s.roi // 2}).astype(float) for _k in range(s)]), axis=0)")
    flips = [{"_target_": "RandFlipd", "keys": both, "spatial_axis": axis, "prob": 0.5} for axis in range(3)]
    return {
        "imports": ["$import glob", "$import json", "$import os", "$import ignite", "$from scipy import ndimage"],
        "input_channels": IN_CHANNELS,
        "output_classes": NUM_CLASSES,
        "arch_ckpt_path": f"$@bundle_root + '/{ARCH_FILE}'",
        "arch_ckpt": "$torch.load(@arch_ckpt_path, map_location=torch.device('cuda'))",
        "bundle_root": ".",
        "ckpt_dir": "$@bundle_root + '/models'",
        "output_dir": "$@bundle_root + '/eval'",
        "dataset_dir": "/workspace/data/msd/Task07_Pancreas",
        "data_list_file_path": "$@bundle_root + '/configs/dataset_0.json'",
        "train_datalist": "$monai.data.load_decathlon_datalist(@data_list_file_path, data_list_key='training', "
                          "base_dir=@dataset_dir)",
        "val_datalist": "$monai.data.load_decathlon_datalist(@data_list_file_path, data_list_key='validation', "
                        "base_dir=@dataset_dir)",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "dints_space": _dints_space(s),
        "network_def": {
            "_target_": "monai.networks.nets.DiNTS",
            "dints_space": "@dints_space",
            "in_channels": "@input_channels",
            "num_classes": "@output_classes",
            "use_downsample": True,
            "node_a": "$@arch_ckpt['node_a']",
        },
        "network": "$@network_def.to(@device)",
        "loss": {"_target_": "DiceCELoss", "include_background": False, "to_onehot_y": True, "softmax": True,
                 "squared_pred": True, "batch": True, "smooth_nr": 1.0e-05, "smooth_dr": 1.0e-05},
        "optimizer": {"_target_": "torch.optim.SGD", "params": "$@network.parameters()", "momentum": 0.9,
                      "weight_decay": 4.0e-05, "lr": 0.025},
        "lr_scheduler": {"_target_": "torch.optim.lr_scheduler.StepLR", "optimizer": "@optimizer", "step_size": 80,
                         "gamma": 0.5},
        "image_key": "image",
        "label_key": "label",
        "val_interval": 10,
        "train": {
            "deterministic_transforms": [
                {"_target_": "LoadImaged", "keys": both, "image_only": False},
                {"_target_": "EnsureChannelFirstd", "keys": both},
                {"_target_": "Orientationd", "keys": both, "axcodes": "RAS"},
                {"_target_": "Spacingd", "keys": both, "pixdim": [s.pixdim] * 3, "mode": ["bilinear", "nearest"],
                 "align_corners": [True, True]},
                {"_target_": "CastToTyped", "keys": "@image_key", "dtype": "$torch.float32"},
                {"_target_": "ScaleIntensityRanged", "keys": "@image_key", "a_min": -87, "a_max": 199, "b_min": 0,
                 "b_max": 1, "clip": True},
                {"_target_": "CastToTyped", "keys": both, "dtype": ["$np.float16", "$np.uint8"]},
                {"_target_": "CopyItemsd", "keys": "@label_key", "times": 1, "names": ["label4crop"]},
                {"_target_": "Lambdad", "keys": "label4crop", "func": dilate, "overwrite": True},
                {"_target_": "EnsureTyped", "keys": both},
                {"_target_": "CastToTyped", "keys": "@image_key", "dtype": "$torch.float32"},
                {"_target_": "SpatialPadd", "keys": [*both, "label4crop"], "spatial_size": roi,
                 "mode": ["reflect", "constant", "constant"]},
            ],
            "random_transforms": [
                {"_target_": "RandCropByLabelClassesd", "keys": both, "label_key": "label4crop",
                 "num_classes": "@output_classes", "ratios": "$[1,] * @output_classes", "spatial_size": roi,
                 "num_samples": 1},
                {"_target_": "Lambdad", "keys": "label4crop", "func": "$lambda x: 0"},
                {"_target_": "RandRotated", "keys": both, "range_x": 0.3, "range_y": 0.3, "range_z": 0.3,
                 "mode": ["bilinear", "nearest"], "prob": 0.2},
                {"_target_": "RandZoomd", "keys": both, "min_zoom": 0.8, "max_zoom": 1.2,
                 "mode": ["trilinear", "nearest"], "align_corners": [True, None], "prob": 0.16},
                {"_target_": "RandGaussianSmoothd", "keys": "@image_key", "sigma_x": [0.5, 1.15],
                 "sigma_y": [0.5, 1.15], "sigma_z": [0.5, 1.15], "prob": 0.15},
                {"_target_": "RandScaleIntensityd", "keys": "@image_key", "factors": 0.3, "prob": 0.5},
                {"_target_": "RandShiftIntensityd", "keys": "@image_key", "offsets": 0.1, "prob": 0.5},
                {"_target_": "RandGaussianNoised", "keys": "@image_key", "std": 0.01, "prob": 0.15},
                *flips,
                {"_target_": "CastToTyped", "keys": both, "dtype": ["$torch.float32", "$torch.uint8"]},
                {"_target_": "ToTensord", "keys": both},
            ],
            "preprocessing": {"_target_": "Compose",
                              "transforms": "$@train#deterministic_transforms + @train#random_transforms"},
            "dataset": {"_target_": "CacheDataset", "data": "@train_datalist", "transform": "@train#preprocessing",
                        "cache_rate": cache_rate, "num_workers": workers},
            "dataloader": {"_target_": "DataLoader", "dataset": "@train#dataset", "batch_size": 2, "shuffle": True,
                           "num_workers": workers},
            "inferer": {"_target_": "SimpleInferer"},
            "postprocessing": {
                "_target_": "Compose",
                "transforms": [
                    {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                    {"_target_": "AsDiscreted", "keys": ["pred", "label"], "argmax": [True, False],
                     "to_onehot": "@output_classes"},
                ],
            },
            "handlers": [
                {"_target_": "LrScheduleHandler", "lr_scheduler": "@lr_scheduler", "print_lr": True},
                {"_target_": "ValidationHandler", "validator": "@validate#evaluator", "epoch_level": True,
                 "interval": "@val_interval"},
                {"_target_": "StatsHandler", "tag_name": "train_loss", "output_transform": loss_output},
                {"_target_": "TensorBoardStatsHandler", "log_dir": "@output_dir", "tag_name": "train_loss",
                 "output_transform": loss_output},
            ],
            "key_metric": {"train_accuracy": {"_target_": "ignite.metrics.Accuracy", "output_transform": pred_label}},
            "trainer": {
                "_target_": "SupervisedTrainer", "max_epochs": 400, "device": "@device",
                "train_data_loader": "@train#dataloader", "network": "@network", "loss_function": "@loss",
                "optimizer": "@optimizer", "inferer": "@train#inferer", "postprocessing": "@train#postprocessing",
                "key_train_metric": "@train#key_metric", "train_handlers": "@train#handlers", "amp": True,
            },
        },
        "validate": {
            "preprocessing": {"_target_": "Compose", "transforms": "%train#deterministic_transforms"},
            "dataset": {"_target_": "CacheDataset", "data": "@val_datalist", "transform": "@validate#preprocessing",
                        "cache_rate": cache_rate},
            "dataloader": {"_target_": "DataLoader", "dataset": "@validate#dataset", "batch_size": 1,
                           "shuffle": False, "num_workers": workers},
            "inferer": {"_target_": "SlidingWindowInferer", "roi_size": roi, "sw_batch_size": 6, "overlap": 0.625},
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


def datalist() -> dict:
    """configs/dataset_0.json: the Decathlon layout the config reads (`testing` under `--dataset_dir`), listing the
    rocm_zoo test phantoms instead of the Task07 cases."""
    names = [spec.name for spec in phantom.test_specs()]
    return {
        "description": "rocm_zoo synthetic CT phantoms (SAMPLE data, no pancreas tumour labels)",
        "labels": {"0": "background", "1": "pancreas", "2": "cancer"},
        "modality": {"0": "CT"},
        "name": "Pancreas (rocm_zoo sample)",
        "num_testing": len(names),
        "num_training": 0,
        "num_validation": 0,
        "tensorImageSize": "3D",
        "testing": [{"image": f"./imagesTr/{n}.nii.gz", "label": f"./labelsTr/{n}.nii.gz"} for n in names],
        "training": [],
        "validation": [],
    }


def metadata(size: str) -> dict:
    s = _size(size)
    spatial = [s.roi] * 3
    return {
        "version": sample_version(UPSTREAM_VERSION, size),
        "name": "Pancreas CT DiNTS segmentation (rocm_zoo sample)",
        "task": "Neural architecture search on pancreas CT segmentation",
        "description": f"rocm_zoo SAMPLE of the Model Zoo pancreas DiNTS bundle, {size} size: a seeded random "
        "architecture code (no search was run) and "
        + (f"weights {TRAINED}" if size == "tiny" else "untrained (seeded random) weights") + ". Not a clinical model.",
        "intended_use": "Software testing and benchmarking only. Not for diagnostic use.",
        "label_classes": "single channel data, 1 is pancreas, 2 is pancreatic tumor, 0 is everything else",
        "pred_classes": "3 channels OneHot data, channel 1 is pancreas, channel 2 is pancreatic tumor, "
        "channel 0 is background",
        "network_data_format": {
            "inputs": {"image": {"type": "image", "format": "hounsfield", "modality": "CT",
                                 "num_channels": IN_CHANNELS, "spatial_shape": spatial, "dtype": "float32",
                                 "value_range": [0, 1], "is_patch_data": True, "channel_def": {"0": "image"}}},
            "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": NUM_CLASSES,
                                 "spatial_shape": spatial, "dtype": "float32", "value_range": [0, 1, 2],
                                 "is_patch_data": True,
                                 "channel_def": {"0": "background", "1": "pancreas", "2": "pancreatic tumor"}}},
        },
    }


def write_files(bundle_dir: Path, size: str) -> None:
    """Configs (inference and train), metadata, datalist and the architecture code; weights are written by
    `write_sample_bundle`."""
    check_size(size)
    bundle_dir = Path(bundle_dir)
    write_text(bundle_dir / CONFIG_FILE, yaml.safe_dump(inference_config(size), sort_keys=False, width=120))
    write_text(bundle_dir / TRAIN_CONFIG_FILE, yaml.safe_dump(train_config(size), sort_keys=False, width=120))
    write_json(bundle_dir / "configs" / "metadata.json", metadata(size))
    write_json(bundle_dir / "configs" / "dataset_0.json", datalist())
    write_torch(bundle_dir / ARCH_FILE, arch_code(size))


def build_network(size: str, code: dict | None = None) -> torch.nn.Module:
    """DiNTS as the config builds it (on the CPU), from `code` (default: the sample's architecture code)."""
    from monai.networks.nets import DiNTS, TopologyInstance

    s = _size(size)
    code = arch_code(size) if code is None else code
    space = TopologyInstance(channel_mul=s.channel_mul, num_blocks=s.num_blocks, num_depths=NUM_DEPTHS,
                             use_downsample=True, arch_code=[code["arch_code_a"], code["arch_code_c"]], device="cpu")
    return DiNTS(space, in_channels=IN_CHANNELS, num_classes=NUM_CLASSES, use_downsample=True,
                 node_a=torch.from_numpy(code["node_a"]))


def random_weights(size: str, seed: int = 0) -> dict[str, dict]:
    """Seeded untrained weights, by file inside the bundle."""
    code = arch_code(size)
    torch.manual_seed(seed)
    return {"models/model.pt": build_network(size, code).state_dict()}
