"""Honest sample bundles: the Model Zoo bundle's config structure, transforms and network class, at two sizes.

`tiny` keeps every transform and the DynUNet architecture (kernels, strides, instance norm, residual blocks) but with
narrow filters and a 64^3 network input, so it runs on a laptop CPU; its weights are trained on the synthetic
phantoms (see sample_train.py). `full` is the real network size (31 M parameters, 128^3 input) with untrained,
seeded weights, for GPU benchmarks. Neither is a clinical model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rocm_zoo.samples.bundles.common import check_size, sample_version, write_json, write_text

NAME = "spleen_deepedit_annotation"
TINY_FILTERS = [8, 16, 32, 48, 64, 64]
TINY_SPATIAL = [64, 64, 64]
FULL_SPATIAL = [128, 128, 128]

# The bundle's own `scripts/transforms.py`: maps clicks from the original voxel grid into the reoriented one.
_SCRIPTS_TRANSFORMS = '''"""Clicks arrive in voxel coordinates of the image as stored; the network sees it reoriented to RAS."""
import numpy as np
from monai.transforms.transform import Transform


class OrientationGuidanceMultipleLabelDeepEditd(Transform):
    def __init__(self, ref_image="image", label_names=None):
        self.ref_image = ref_image
        self.label_names = label_names

    def __call__(self, data):
        d = dict(data)
        meta = d[self.ref_image].meta
        to_current = np.linalg.inv(np.asarray(meta["affine"], dtype=float)) @ np.asarray(meta["original_affine"], dtype=float)
        for label in self.label_names:
            points = d.get(label, [])
            if len(points) < 1:
                continue
            homogeneous = np.concatenate([np.asarray(points, dtype=float), np.ones((len(points), 1))], axis=1)
            d[label] = (homogeneous @ to_current.T)[:, :3]
        return d
'''


def inference_config(size: str) -> dict:
    """The bundle's configs/inference.json: the Model Zoo layout, keys and transforms, sized by `size`."""
    network_def = {
        "_target_": "DynUNet",
        "spatial_dims": 3,
        "in_channels": "$len(@label_names) + @number_intensity_ch",
        "out_channels": "$len(@label_names)",
        "kernel_size": [3, 3, 3, 3, 3, 3],
        "strides": [1, 2, 2, 2, 2, [2, 2, 1]],
        "upsample_kernel_size": [2, 2, 2, 2, [2, 2, 1]],
        "norm_name": "instance",
        "deep_supervision": False,
        "res_block": True,
    }
    if size == "tiny":
        network_def["filters"] = TINY_FILTERS
    image = "@image_key"
    return {
        "imports": ["$import glob", "$import numpy", "$import os", "$import ignite"],
        "bundle_root": ".",
        "image_key": "image",
        "output_dir": "$@bundle_root + '/eval'",
        "output_ext": ".nii.gz",
        "output_dtype": "$numpy.float32",
        "output_postfix": "trans",
        "separate_folder": True,
        "load_pretrain": True,
        "dataset_dir": "/workspace/Datasets/MSD_datasets/Task09_Spleen",
        "datalist": "$list(sorted(glob.glob(@dataset_dir + '/imagesTs/*.nii.gz')))",
        "label_names": {"spleen": 1, "background": 0},
        "spatial_size": TINY_SPATIAL if size == "tiny" else FULL_SPATIAL,
        "number_intensity_ch": 1,
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "network_def": network_def,
        "network": "$@network_def.to(@device)",
        "preprocessing_transforms": [
            {"_target_": "LoadImaged", "keys": image, "reader": "ITKReader"},
            {"_target_": "EnsureChannelFirstd", "keys": image},
            {"_target_": "Orientationd", "keys": image, "axcodes": "RAS"},
            {"_target_": "ScaleIntensityRanged", "keys": image, "a_min": -175, "a_max": 250,
             "b_min": 0.0, "b_max": 1.0, "clip": True},
        ],
        "deepedit_transforms": [
            {"_target_": "scripts.transforms.OrientationGuidanceMultipleLabelDeepEditd", "ref_image": image,
             "label_names": "@label_names"},
            {"_target_": "AddGuidanceFromPointsDeepEditd", "ref_image": image, "guidance": "guidance",
             "label_names": "@label_names"},
            {"_target_": "Resized", "keys": image, "spatial_size": "@spatial_size", "mode": "area"},
            {"_target_": "ResizeGuidanceMultipleLabelDeepEditd", "guidance": "guidance", "ref_image": image},
            {"_target_": "AddGuidanceSignalDeepEditd", "keys": image, "guidance": "guidance",
             "number_intensity_ch": "@number_intensity_ch"},
        ],
        "extra_transforms": [{"_target_": "EnsureTyped", "keys": image}],
        "preprocessing": {
            "_target_": "Compose",
            "transforms": "$@preprocessing_transforms + @deepedit_transforms + @extra_transforms",
        },
        "dataset": {"_target_": "Dataset", "data": "$[{'image': i} for i in @datalist]", "transform": "@preprocessing"},
        "dataloader": {"_target_": "DataLoader", "dataset": "@dataset", "batch_size": 1, "shuffle": False,
                       "num_workers": 0},
        "inferer": {"_target_": "SimpleInferer"},
        "postprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "EnsureTyped", "keys": "pred"},
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
        "checkpointloader": {"_target_": "CheckpointLoader", "load_path": "$@bundle_root + '/models/model.pt'",
                             "load_dict": {"model": "@network"}},
        "initialize": ["$monai.utils.set_determinism(seed=123)",
                       "$@checkpointloader(@evaluator) if @load_pretrain else None"],
        "run": ["$@evaluator.run()"],
    }


def train_config(size: str) -> dict:
    """The bundle's configs/train.json: the Model Zoo layout, keys, transforms, loss and optimiser (upstream 0.5.x), with
    the network and input sized by `size`; tiny caches its few phantoms without worker threads."""
    inference = inference_config(size)
    both = ["image", "label"]
    tiny = size == "tiny"

    def dice(name: str) -> dict:
        return {name: {"_target_": "MeanDice", "output_transform": "$monai.handlers.from_engine(['pred', 'label'])"}}

    def interaction(train: bool) -> dict:
        return {"_target_": "Interaction", "deepgrow_probability": "@deepgrow_probability_" + ("train" if train else "val"),
                "transforms": "@train#click_transforms", "click_probability_key": "probability", "train": train,
                "label_names": "@label_names"}

    def cached(data: str, transform: str) -> dict:
        return {"_target_": "CacheDataset", "data": data, "transform": transform, "cache_rate": 1.0,
                "num_workers": 0 if tiny else 4}

    def flip(axis: int) -> dict:
        return {"_target_": "RandFlipd", "keys": both, "spatial_axis": [axis], "prob": 0.1}

    loss_out = "$monai.handlers.from_engine(['loss'], first=True)"
    return {
        "imports": ["$import glob", "$import os", "$import ignite"],
        "bundle_root": ".",
        "ckpt_dir": "$@bundle_root + '/models'",
        "output_dir": "$@bundle_root + '/eval'",
        "dataset_dir": "/workspace/Datasets/MSD_datasets/Task09_Spleen",
        "images": "$list(sorted(glob.glob(@dataset_dir + '/imagesTr/*.nii.gz')))",
        "labels": "$list(sorted(glob.glob(@dataset_dir + '/labelsTr/*.nii.gz')))",
        "label_names": inference["label_names"],
        "finetune": False,
        "finetune_model_path": "$@bundle_root + '/models/model.pt'",
        "early_stop": False,
        "spatial_size": inference["spatial_size"],
        "number_intensity_ch": 1,
        "deepgrow_probability_train": 0.4,
        "deepgrow_probability_val": 1.0,
        "val_interval": 1,
        "device": inference["device"],
        "network_def": inference["network_def"],
        "network": "$@network_def.to(@device)",
        "loss": {"_target_": "DiceCELoss", "to_onehot_y": True, "softmax": True},
        "optimizer": {"_target_": "torch.optim.Adam", "params": "$@network.parameters()", "lr": 0.0001},
        "lr_scheduler": {"_target_": "torch.optim.lr_scheduler.StepLR", "optimizer": "@optimizer", "step_size": 1000,
                         "gamma": 0.1},
        "train": {
            "preprocessing_transforms": [
                {"_target_": "LoadImaged", "keys": both, "reader": "ITKReader"},
                {"_target_": "NormalizeLabelsInDatasetd", "keys": "label", "label_names": "@label_names"},
                {"_target_": "EnsureChannelFirstd", "keys": both},
                {"_target_": "Orientationd", "keys": both, "axcodes": "RAS"},
                {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -175, "a_max": 250, "b_min": 0.0,
                 "b_max": 1.0, "clip": True},
            ],
            "random_transforms": [
                flip(0), flip(1), flip(2),
                {"_target_": "RandRotate90d", "keys": both, "prob": 0.1, "max_k": 3},
                {"_target_": "RandShiftIntensityd", "keys": "image", "offsets": 0.1, "prob": 0.5},
            ],
            "deepedit_transforms": [
                {"_target_": "Resized", "keys": both, "spatial_size": "@spatial_size", "mode": ["area", "nearest"]},
                {"_target_": "FindAllValidSlicesMissingLabelsd", "keys": "label", "sids": "sids"},
                {"_target_": "AddInitialSeedPointMissingLabelsd", "keys": "label", "guidance": "guidance",
                 "sids": "sids"},
                {"_target_": "AddGuidanceSignalDeepEditd", "keys": "image", "guidance": "guidance",
                 "number_intensity_ch": "@number_intensity_ch"},
                {"_target_": "ToTensord", "keys": both},
            ],
            "preprocessing": {
                "_target_": "Compose",
                "transforms": "$@train#preprocessing_transforms + @train#random_transforms + @train#deepedit_transforms",
            },
            "click_transforms": {
                "_target_": "Compose",
                "transforms": [
                    {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                    {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
                    {"_target_": "ToNumpyd", "keys": ["image", "label", "pred"]},
                    {"_target_": "FindDiscrepancyRegionsDeepEditd", "keys": "label", "pred": "pred",
                     "discrepancy": "discrepancy"},
                    {"_target_": "AddRandomGuidanceDeepEditd", "keys": "NA", "guidance": "guidance",
                     "discrepancy": "discrepancy", "probability": "probability"},
                    {"_target_": "AddGuidanceSignalDeepEditd", "keys": "image", "guidance": "guidance",
                     "number_intensity_ch": "@number_intensity_ch"},
                    {"_target_": "ToTensord", "keys": both},
                ],
            },
            "dataset": cached("$[{'image': i, 'label': l} for i, l in zip(@images[:-9], @labels[:-9])]",
                              "@train#preprocessing"),
            "dataloader": {"_target_": "DataLoader", "dataset": "@train#dataset", "batch_size": 1, "shuffle": True,
                           "num_workers": 0},
            "inferer": {"_target_": "SimpleInferer"},
            "postprocessing": {
                "_target_": "Compose",
                "transforms": [
                    {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                    {"_target_": "AsDiscreted", "keys": ["pred", "label"], "argmax": [True, False],
                     "to_onehot": "$len(@label_names)+1"},
                ],
            },
            "handlers": [
                {"_target_": "CheckpointLoader", "_disabled_": "$not @finetune", "load_path": "@finetune_model_path",
                 "load_dict": {"model": "@network"}},
                {"_target_": "LrScheduleHandler", "lr_scheduler": "@lr_scheduler", "print_lr": True},
                {"_target_": "ValidationHandler", "validator": "@validate#evaluator", "epoch_level": True,
                 "interval": "@val_interval"},
                {"_target_": "StatsHandler", "tag_name": "train_loss", "output_transform": loss_out},
                {"_target_": "TensorBoardStatsHandler", "log_dir": "@output_dir", "tag_name": "train_loss",
                 "output_transform": loss_out},
            ],
            "key_metric": dice("train_dice"),
            "train_iteration_update": interaction(True),
            "trainer": {
                "_target_": "SupervisedTrainer", "device": "@device", "max_epochs": 500,
                "train_data_loader": "@train#dataloader", "network": "@network", "optimizer": "@optimizer",
                "loss_function": "@loss", "inferer": "@train#inferer", "amp": True,
                "postprocessing": "@train#postprocessing", "key_train_metric": "@train#key_metric",
                "train_handlers": "@train#handlers", "iteration_update": "@train#train_iteration_update",
            },
        },
        "validate": {
            "preprocessing": {"_target_": "Compose",
                              "transforms": "$@train#preprocessing_transforms + @train#deepedit_transforms"},
            "dataset": cached("$[{'image': i, 'label': l} for i, l in zip(@images[-9:], @labels[-9:])]",
                              "@validate#preprocessing"),
            "dataloader": {"_target_": "DataLoader", "dataset": "@validate#dataset", "batch_size": 1,
                           "shuffle": False, "num_workers": 0},
            "inferer": {"_target_": "SimpleInferer"},
            "postprocessing": "%train#postprocessing",
            "handlers": [
                {"_target_": "EarlyStopHandler", "_disabled_": "$not @early_stop", "trainer": None, "patience": 1,
                 "score_function": "$lambda x: x.state.metrics['val_mean_dice']", "min_delta": 0.01},
                {"_target_": "StatsHandler", "iteration_log": False},
                {"_target_": "TensorBoardStatsHandler", "log_dir": "@output_dir", "iteration_log": False},
                {"_target_": "CheckpointSaver", "save_dir": "@ckpt_dir", "save_dict": {"model": "@network"},
                 "save_key_metric": True, "key_metric_filename": "model.pt"},
            ],
            "key_metric": dice("val_mean_dice"),
            "val_iteration_update": interaction(False),
            "evaluator": {
                "_target_": "SupervisedEvaluator", "device": "@device", "val_data_loader": "@validate#dataloader",
                "network": "@network", "inferer": "@validate#inferer", "postprocessing": "@validate#postprocessing",
                "key_val_metric": "@validate#key_metric", "val_handlers": "@validate#handlers",
                "iteration_update": "@validate#val_iteration_update", "amp": True,
            },
        },
        "initialize": ["$monai.utils.set_determinism(seed=123)"],
        "run": ["$@validate#handlers#0.set_trainer(trainer=@train#trainer) if @early_stop else None",
                "$@train#trainer.run()"],
    }


def metadata(size: str) -> dict:
    spatial = TINY_SPATIAL if size == "tiny" else FULL_SPATIAL
    trained = "trained on rocm_zoo's synthetic phantoms" if size == "tiny" else "untrained (seeded random)"
    return {
        "version": sample_version("0.5.0", size),
        "name": "Spleen DeepEdit annotation (rocm_zoo sample)",
        "task": "Decathlon spleen segmentation",
        "description": f"rocm_zoo SAMPLE of the Model Zoo spleen DeepEdit bundle, {size} size, weights {trained}. "
        "Not a clinical model.",
        "intended_use": "Software testing and benchmarking only. Not for diagnostic use.",
        "network_data_format": {
            "inputs": {"image": {"type": "image", "format": "hounsfield", "modality": "CT", "num_channels": 3,
                                 "spatial_shape": spatial, "dtype": "float32", "value_range": [0, 1],
                                 "is_patch_data": False, "channel_def": {"0": "image"}}},
            "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": 2,
                                 "spatial_shape": spatial, "dtype": "float32", "value_range": [0, 1],
                                 "is_patch_data": False, "channel_def": {"0": "background", "1": "spleen"}}},
        },
    }


def write_files(bundle_dir: Path, size: str) -> None:
    """Configs and scripts; weights are written by `rocm_zoo.samples.bundles.write_sample_bundle`."""
    check_size(size)
    write_json(bundle_dir / "configs" / "inference.json", inference_config(size))
    write_json(bundle_dir / "configs" / "train.json", train_config(size))
    write_json(bundle_dir / "configs" / "metadata.json", metadata(size))
    write_text(bundle_dir / "scripts" / "__init__.py", "")
    write_text(bundle_dir / "scripts" / "transforms.py", _SCRIPTS_TRANSFORMS)


def build_network(size: str) -> torch.nn.Module:
    from monai.networks.nets import DynUNet

    cfg = inference_config(size)["network_def"]
    kwargs = {k: v for k, v in cfg.items() if k != "_target_"}
    kwargs["in_channels"], kwargs["out_channels"] = 3, 2
    return DynUNet(**kwargs)


def random_weights(size: str, seed: int = 0) -> dict[str, dict]:
    """Seeded untrained weights, by file inside the bundle."""
    torch.manual_seed(seed)
    return {"models/model.pt": build_network(size).state_dict()}
