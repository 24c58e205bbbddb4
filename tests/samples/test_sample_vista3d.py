"""The vista3d sample bundle: its upstream layout and quirks, and its own workflow (`python -m monai.bundle run`) with
and without the rocm_zoo overlay, on a CPU, at the tiny size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from rocm_zoo.engine.masks import central_voxel, dice
from rocm_zoo.engine.overlay import OVERLAYS_DIR, bundle_on_path, load_config, read_settings, submodules_to_compile
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import vista3d, write_sample_bundle
from zoo_test_support import skip_without_native_bf16

OVERLAY = OVERLAYS_DIR / vista3d.NAME / "inference_rocm.json"
VISTA_SPLEEN = 3  # VISTA3D's global class id for the spleen
# A small LPS-stored phantom (240 x 192 x 80 mm, the spleen inside): resampled to 1.5 mm and cropped, about
# 160 x 128 x 53 voxels, 12 windows of the tiny bundle's 64^3 patch, so a whole CPU run takes seconds after
# compiling. LPS storage makes the click mapping (stored voxels -> preprocessed voxels) matter.
SPEC = phantom.PhantomSpec("phantom_vista", (60, 48, 16), (4.0, 4.0, 5.0), seed=phantom.test_specs()[0].seed,
                           orientation="LPS")


@dataclass(frozen=True)
class Sample:
    bundle: Path
    image: Path
    truth: np.ndarray
    root: Path


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Sample:
    root = tmp_path_factory.mktemp("vista3d")
    bundle = write_sample_bundle(root / "model", vista3d, "tiny")
    shutil.copy(OVERLAY, bundle / "configs")
    p = phantom.make_phantom(SPEC)
    image = root / "images" / f"{SPEC.name}.nii.gz"
    phantom.write_phantom(p, image, root / "truth" / f"{SPEC.name}.nii.gz")
    return Sample(bundle, image, p.truth, root)


def _run_bundle(sample: Sample, configs: list[str], request: dict, out: Path, *extra: str) -> np.ndarray:
    """The bundle's own workflow, from inside the bundle folder (its `scripts` must be importable); the saved label."""
    cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", repr(configs), "--bundle_root", ".",
           "--input_dict", repr({"image": str(sample.image), **request}), "--output_dir", str(out), *extra]
    run = subprocess.run(cmd, cwd=sample.bundle, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    saved = out / SPEC.name / f"{SPEC.name}_trans.nii.gz"
    return np.asarray(nib.load(saved).dataobj)


@pytest.fixture(scope="module")
def fp32_label(sample) -> np.ndarray:
    # Without the overlay, eager. `amp` off: the sample evaluator autocasts for the device it runs on, and CPU
    # autocast defaults to bf16, so the bundle's `amp: true` would not be an fp32 baseline here.
    return _run_bundle(sample, ["configs/inference.json"], {"label_prompt": [VISTA_SPLEEN]},
                       sample.root / "out_fp32", "--evaluator#amp", "False")


@pytest.mark.slow
def test_bundle_run_fp32_baseline(sample, fp32_label):
    assert fp32_label.shape == SPEC.shape  # inverted back onto the stored grid
    assert set(np.unique(fp32_label)) <= {0, VISTA_SPLEEN}


@pytest.mark.slow
def test_bundle_run_with_the_overlay_matches_fp32(sample, fp32_label):
    skip_without_native_bf16()  # the compiled overlay through `monai bundle run` is also the clicks test's path
    label = _run_bundle(sample, ["configs/inference.json", "configs/inference_rocm.json"],
                        {"label_prompt": [VISTA_SPLEEN]}, sample.root / "out_rocm")
    assert label.shape == SPEC.shape
    assert set(np.unique(label)) <= {0, VISTA_SPLEEN}
    # Same weights, bf16 autocast + channels-last + compiled encoder and class head vs fp32 eager. bf16 keeps 8
    # significant bits, so after ~40 convolutions a logit moves by a fraction of a percent of its scale; untrained
    # weights leave many voxels with logits that close to 0, and only those flip. Measured here: 97.6 % of voxels
    # agree and the spleen-class Dice is 0.95. Other weights (seed 1, i.e. a network that kept its random init instead
    # of loading the checkpoint) give 54 % agreement and Dice 0.20 on the same run, far below these bounds.
    assert (label == fp32_label).mean() >= 0.95
    present = fp32_label == VISTA_SPLEEN
    assert present.any() and (~present).any(), "an all-or-nothing baseline would make the comparison vacuous"
    assert dice(label == VISTA_SPLEEN, present) >= 0.9


@pytest.mark.slow
def test_bundle_run_with_clicks_and_the_overlay(sample):
    click = central_voxel(sample.truth == phantom.ORGAN_LABELS["spleen"])  # voxel of the image as stored (LPS)
    label = _run_bundle(sample, ["configs/inference.json", "configs/inference_rocm.json"],
                        {"points": [click], "point_labels": [1]}, sample.root / "out_points")
    assert label.shape == SPEC.shape
    # Clicks without a class: the point head alone, in one 64^3 window centred on the click (clamped to the image);
    # voxels outside every window are NaN, saved as 255 (upstream's nan_to_num); the class is 1 (one object).
    assert set(np.unique(label)) <= {0, 1, 255}
    window = label != 255
    assert window[tuple(click)], "the window must contain the click: points are mapped into the preprocessed grid"
    assert 0 < window.mean() < 1


def test_bundle_scripts_import_only_from_the_bundle_root(sample, tmp_path):
    """Upstream quirk: the config imports the bundle's `scripts` by that bare name."""
    code = ("from monai.bundle import ConfigParser\n"
            "p = ConfigParser()\n"
            f"p.read_config({str(sample.bundle / 'configs' / 'inference.json')!r})\n"
            f"p['bundle_root'] = {str(sample.bundle)!r}\n"
            "try:\n"
            "    p.get_parsed_content('inferer')\n"
            "except ModuleNotFoundError as e:\n"
            "    print('ModuleNotFoundError', e)\n")
    # a clean cwd, in a fresh process: this repository's own scripts/ folder would import as a namespace package
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ModuleNotFoundError" in run.stdout and "scripts.inferer" in run.stdout, run.stdout

    with bundle_on_path(sample.bundle):
        parser = load_config(sample.bundle, "configs/inference.json", (sample.bundle / "configs" / OVERLAY.name,))
        network = parser.get_parsed_content("network_def")
        inferer = parser.get_parsed_content("inferer")
    assert type(network).__name__ == "VISTA3D" and type(inferer).__name__ == "Vista3dInferer"
    network.load_state_dict(torch.load(sample.bundle / "models" / "model.pt", weights_only=True), strict=True)
    # the overlay compiles after the bundle's checkpoint load, and only the encoder, the class head and the point
    # transformer (whose token count follows the clicks: shapes dynamic)
    assert parser["initialize"] == ["$monai.utils.set_determinism(seed=123)", "$@checkpointloader(@evaluator)",
                                    "$compile_network(@network, @rocm_overlay)"]
    settings = read_settings(parser)
    assert submodules_to_compile(network, settings) == [("image_encoder", network.image_encoder),
                                                        ("class_head", network.class_head),
                                                        ("point_head.transformer", network.point_head.transformer)]
    assert settings.compile_dynamic == ("point_head.transformer",)
    # one call the way the server and the benchmark make it: a volume smaller than the patch is padded
    with torch.no_grad():
        out = inferer(torch.rand(1, 1, 40, 36, 20), network.eval(), class_vector=torch.tensor([[VISTA_SPLEEN]]))
    assert out.shape == (1, 1, 40, 36, 20)


def test_metadata_labels_and_everything(sample):
    meta = json.loads((sample.bundle / "configs" / "metadata.json").read_text())
    assert "rocm_zoo.sample" in meta["version"] and meta["version"].startswith(vista3d.UPSTREAM_VERSION)
    assert "SAMPLE" in meta["description"] and "Not a clinical model" in meta["description"]
    channels = meta["network_data_format"]["outputs"]["pred"]["channel_def"]
    assert len(channels) == 133 and channels["0"] == "background"  # 132 classes + background
    for i, name in {1: "liver", 3: "spleen", 14: "left kidney", 33: "vertebrae L5", 56: "vertebrae C1",
                    63: "left rib 1", 86: "right rib 12", 117: "right kidney cyst", 127: "vertebrae S1",
                    131: "vertebrae L6", 132: "airway"}.items():
        assert channels[str(i)] == name
    labels = json.loads((sample.bundle / "docs" / "labels.json").read_text())
    assert labels == {name: int(i) for i, name in channels.items() if i != "0"}

    parser = load_config(sample.bundle, "configs/inference.json")  # no `scripts` needed for these keys
    everything = parser.get_parsed_content("everything_labels")
    assert len(everything) == 117 and VISTA_SPLEEN in everything and 2 not in everything  # "kidney" has subclasses
    assert parser.get_parsed_content("labels_dict") == channels
