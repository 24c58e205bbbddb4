"""Honest sample of the Model Zoo wholeBody_ct_segmentation bundle (0.2.5): its inference config, network class and
transforms, at two sizes, with seeded untrained weights. Neither size is a clinical model.

Upstream ships two checkpoints of one SegResNet: `models/model.pt` (trained at 1.5 mm) and `models/model_lowres.pt`
(3.0 mm); `displayable_configs#highres` picks both the spacing and the file (`--displayable_configs#highres False` on
the command line: `false` in lower case reaches the config as a truthy string). The sample writes both, from
different seeds. `tiny` changes only the size keys: `init_filters` 8, a 48^3 window, and 4 / 6 mm resampling instead
of 1.5 / 3.0 mm (a window costs ~1.2 s on two CPU cores; at 1.5 mm a 400 mm field of view is ~250 windows).
Everything else is upstream's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rocm_zoo.samples.bundles.common import check_size, sample_version, write_json

NAME = "wholeBody_ct_segmentation"
UPSTREAM_VERSION = "0.2.5"
INIT_FILTERS = {"tiny": 8, "full": 32}
ROI = {"tiny": 48, "full": 96}
PIXDIM = {  # highres else lowres
    "tiny": "$[4.0, 4.0, 4.0] if @displayable_configs#highres else [6.0, 6.0, 6.0]",
    "full": "$[1.5, 1.5, 1.5] if @displayable_configs#highres else [3.0, 3.0, 3.0]",
}
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
        "network_def": {
            "_target_": "SegResNet",
            "spatial_dims": 3,
            "in_channels": IN_CHANNELS,
            "out_channels": len(LABELS),
            "init_filters": INIT_FILTERS[size],
            "blocks_down": [1, 2, 2, 4],
            "blocks_up": [1, 1, 1],
            "dropout_prob": 0.2,
        },
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


def metadata(size: str) -> dict:
    check_size(size)
    roi = [ROI[size]] * 3
    return {
        "version": sample_version(UPSTREAM_VERSION, size),
        "name": "Whole body CT segmentation (rocm_zoo sample)",
        "task": "TotalSegmentator Segmentation",
        "description": f"rocm_zoo SAMPLE of the Model Zoo wholeBody_ct_segmentation bundle, {size} size, "
        "untrained seeded random weights (model.pt and model_lowres.pt). Not a clinical model.",
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
    write_json(bundle_dir / "configs" / "metadata.json", metadata(size))


def build_network(size: str) -> torch.nn.Module:
    from monai.networks.nets import SegResNet

    cfg = inference_config(size)["network_def"]
    return SegResNet(**{k: v for k, v in cfg.items() if k != "_target_"})


def random_weights(size: str, seed: int = 0) -> dict[str, dict]:
    """Seeded untrained weights for both upstream checkpoints, from different seeds (two separately trained models
    upstream), by file inside the bundle."""
    weights = {}
    for i, rel in enumerate(WEIGHT_FILES):
        torch.manual_seed(seed + i)
        weights[rel] = build_network(size).state_dict()
    return weights
