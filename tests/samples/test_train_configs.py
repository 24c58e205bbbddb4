"""The sample bundles' training configs (configs/train.json; DiNTS configs/train.yaml) with their rocm_zoo training
overlays: upstream's keys, and one epoch of training plus one validation on the CPU at the tiny size, driven the way
the training runner drives them (MONAI Label's BundleTrainTask overrides)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.handlers import from_engine

from rocm_zoo.engine.overlay import OVERLAYS_DIR, bundle_on_path, load_config
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import pancreas_dints, swin_unetr_btcv, training_labels, vista3d, wholebody_ct
from rocm_zoo.samples.bundles import write_sample_bundle

# Keys of upstream's train configs (Project-MONAI/model-zoo, models/<bundle>/configs/train.json or train.yaml, read for
# this sample): the top level, and the entries of `train` and `validate`. None of them has `finalize` (only their
# multi_gpu_train configs do).
_TRAIN = {"deterministic_transforms", "random_transforms", "preprocessing", "dataset", "dataloader", "inferer",
          "postprocessing", "handlers", "key_metric", "trainer"}
_VALIDATE = {"preprocessing", "postprocessing", "dataset", "dataloader", "inferer", "handlers", "key_metric",
             "additional_metrics", "evaluator"}
UPSTREAM_KEYS = {
    wholebody_ct: ({"displayable_configs", "imports", "bundle_root", "ckpt_dir", "output_dir", "dataset_dir", "images",
                    "labels", "highres", "val_interval", "init_LR", "batch_size", "pixdim", "modelname", "device",
                    "network_def", "network", "loss", "optimizer", "train", "validate", "initialize", "run"},
                   _TRAIN, _VALIDATE),
    swin_unetr_btcv: ({"imports", "bundle_root", "ckpt_dir", "output_dir", "dataset_dir", "images", "labels",
                       "val_interval", "device", "network_def", "network", "loss", "optimizer", "train", "validate",
                       "initialize", "run"}, _TRAIN, _VALIDATE),
    pancreas_dints: ({"imports", "input_channels", "output_classes", "arch_ckpt_path", "arch_ckpt", "bundle_root",
                      "ckpt_dir", "output_dir", "dataset_dir", "data_list_file_path", "train_datalist", "val_datalist",
                      "device", "dints_space", "network_def", "network", "loss", "optimizer", "lr_scheduler",
                      "image_key", "label_key", "val_interval", "train", "validate", "initialize", "run"},
                     _TRAIN, _VALIDATE),
    vista3d: ({"imports", "bundle_root", "ckpt_dir", "output_dir", "data_list_file_path", "dataset_dir",
               "use_tensorboard", "finetune", "finetune_model_path", "early_stop", "use_mlflow", "mlflow_dir", "fold",
               "device", "epochs", "val_interval", "val_at_start", "sw_overlap", "learning_rate",
               "num_patches_per_image", "input_channels", "output_classes", "max_point", "max_prompt",
               "max_backprompt", "max_foreprompt", "drop_label_prob", "drop_point_prob", "exclude_background",
               "label_set", "val_label_set", "amp", "train_datalist", "val_datalist", "patch_size", "patch_size_valid",
               "network_def", "network", "loss", "optimizer", "lr_schedule", "resample_to_spacing", "train", "validate",
               "initialize", "run"},
              _TRAIN - {"postprocessing"}, _VALIDATE),
}
BUNDLES = list(UPSTREAM_KEYS)
TRAIN_CONFIG = {module: getattr(module, "TRAIN_CONFIG_FILE", "configs/train.json") for module in BUNDLES}

# Phantoms of 4 mm voxels, which the tiny configs' resampling leaves as they are, small enough for one tiny window (the
# validation of the 105-class SegResNet costs ~4 s a 48^3 window on two cores) or one crop: SwinUNETR crops 64^3 with
# no padding, so its phantoms are 64^3. VISTA3D resamples to 1.5 mm at both sizes: its phantoms are a 96 x 96 x 64 mm
# box around the spleen (one 64^3 patch after resampling) cut from a whole phantom.
CUBE48 = phantom.PhantomSpec("phantom", (48, 48, 48), (4.0, 4.0, 4.0), seed=0)
PHANTOMS = {
    wholebody_ct: (CUBE48, None),
    swin_unetr_btcv: (dataclasses.replace(CUBE48, shape=(64, 64, 64)), None),
    pancreas_dints: (CUBE48, None),
    vista3d: (dataclasses.replace(CUBE48, shape=(100, 100, 50)), (24, 24, 16)),
}
# Studies made: all but the last are trained on, the last validates. SwinUNETR trains on one: each study gives two
# 64^3 crops (the config's num_samples), forward and backward with upstream's activation checkpointing. Its epoch
# test took 13.5 s on two idle cores and 45 s on two shared busy ones: marked slow.
STUDIES = {swin_unetr_btcv: 2}
SLOW = {swin_unetr_btcv}


def _around(p: phantom.Phantom, label: int, box: tuple[int, int, int]) -> phantom.Phantom:
    """The `box` of voxels centred on an organ (clamped to the volume), its affine moved to match."""
    centre = np.argwhere(p.truth == label).mean(axis=0).round().astype(int)
    start = [int(np.clip(c - b // 2, 0, n - b)) for c, b, n in zip(centre, box, p.truth.shape)]
    crop = tuple(slice(s, s + b) for s, b in zip(start, box))
    affine = p.affine.copy()
    affine[:3, 3] += affine[:3, :3] @ np.asarray(start, dtype=np.float64)
    return phantom.Phantom(p.spec, np.ascontiguousarray(p.image[crop]), np.ascontiguousarray(p.truth[crop]), affine)


def _studies(module, folder: Path, count: int = 3) -> list[dict[str, str]]:
    """`count` phantoms with training seeds, their truth mapped to the bundle's labels: {"image", "label"} paths."""
    index = training_labels(module.NAME)
    studies = []
    base, box = PHANTOMS[module]
    for seeded in phantom.training_specs(count):
        spec = dataclasses.replace(base, name=seeded.name, seed=seeded.seed)
        p = phantom.make_phantom(spec)
        if box:
            p = _around(p, phantom.ORGAN_LABELS["spleen"], box)
        truth = np.zeros_like(p.truth)
        for organ, label in index.items():
            truth[p.truth == organ] = label
        image, label = folder / "imagesTr" / f"{spec.name}.nii.gz", folder / "labelsTr" / f"{spec.name}.nii.gz"
        phantom.write_phantom(dataclasses.replace(p, truth=truth), image, label)
        studies.append({"image": str(image), "label": str(label)})
    return studies


def _train_overlay(module) -> Path:
    return OVERLAYS_DIR / module.NAME / "train_rocm.json"


@pytest.mark.parametrize("module", BUNDLES, ids=lambda m: m.NAME)
def test_train_config_has_upstreams_keys(module, tmp_path):
    bundle = write_sample_bundle(tmp_path, module, "tiny")
    parser = load_config(bundle, TRAIN_CONFIG[module])
    top, train, validate = UPSTREAM_KEYS[module]
    assert set(parser.get()) - {"_meta_"} == top  # `_meta_`: added by MONAI's parser
    assert set(parser["train"]) == train and set(parser["validate"]) == validate
    for size in ("tiny", "full"):  # the same keys at both sizes
        assert set(module.train_config(size)) == top
    # what the training runner overrides must be plain keys of the config
    for key in ("bundle_root", "device", "train#trainer#max_epochs", "train#dataset#data", "validate#dataset#data",
                "train#handlers", "train#trainer#amp", "validate#evaluator#amp"):
        assert key in parser, key
    assert "val_mean_dice" in parser["validate#key_metric"]


@pytest.mark.parametrize("module", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in BUNDLES],
                         ids=lambda m: m.NAME)
def test_one_epoch_and_one_validation_on_the_cpu(module, tmp_path):
    bundle = write_sample_bundle(tmp_path / "model", module, "tiny")
    studies = _studies(module, tmp_path / "data", STUDIES.get(module, 3))
    parser = load_config(bundle, TRAIN_CONFIG[module], (_train_overlay(module),))
    # what the training runner overrides (as MONAI Label's BundleTrainTask does)
    parser["device"] = "$torch.device('cpu')"
    parser["train#trainer#max_epochs"] = 1
    parser["train#dataset#data"] = studies[:-1]
    parser["validate#dataset#data"] = studies[-1:]
    parser["train#handlers"] = []
    with bundle_on_path(bundle):
        trainer = parser.get_parsed_content("train#trainer")
        network = parser.get_parsed_content("network")
        before = {k: v.detach().clone() for k, v in network.state_dict().items()}
        trainer.run()
        evaluator = parser.get_parsed_content("validate#evaluator")
        evaluator.run()
    output = trainer.state.output
    loss = float(output["loss"] if isinstance(output, dict) else from_engine(["loss"], first=True)(output))
    assert math.isfinite(loss)
    changed = [k for k, v in network.state_dict().items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert changed, "one epoch of training changed no weight"
    dice = evaluator.state.metrics["val_mean_dice"]
    print(f"{module.NAME}: loss {loss:.4f}, val_mean_dice {dice:.4f}, {len(changed)} tensors changed")
    assert isinstance(dice, float) and 0.0 <= dice <= 1.0
