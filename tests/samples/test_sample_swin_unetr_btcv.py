"""The swin_unetr_btcv_segmentation sample: upstream's config with only the size keys changed, upstream's `img_size`
quirk, the compat shim that fixes it, and the overlay through the bundle's own `python -m monai.bundle run`."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from zoo_test_support import flatten_config
from monai.networks.nets import SwinUNETR
from rocm_zoo.engine.compat import swin_unetr
from rocm_zoo.engine.overlay import OVERLAYS_DIR, load_weights
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import swin_unetr_btcv as sample
from rocm_zoo.samples.bundles import write_sample_bundle
from rocm_zoo.samples.bundles.common import SAMPLE_MARK

OVERLAY = OVERLAYS_DIR / sample.NAME / "inference_rocm.json"
# Upstream resamples to 1.5 x 1.5 x 2.0 mm and the tiny network costs ~3-5 s per 64^3 window on two CPU cores, so the
# test phantom is a 104 x 96 x 110 mm field of view around the body centre (69 x 64 x 55 voxels after resampling: two
# windows) instead of a whole 400 mm abdomen (~190 windows). LPS storage and unequal axes catch any axis mix-up.
SPEC = dataclasses.replace(phantom.test_specs(1)[0], name="phantom_small", shape=(26, 24, 22),
                           spacing=(4.0, 4.0, 5.0), orientation="LPS")
# On a CPU the evaluator's `torch.autocast("cuda", ...)` is disabled, so both runs compute in fp32: the overlay only
# changes the memory layout (and, compiled, the kernels), which reorders float sums (~1e-6 relative). The argmax of
# untrained scores flips only where two classes tie to that precision: none of the 13,728 voxels did when measured.
# 0.1% allowed. With a GPU, bf16 autocast is live; its rounding (~0.4% relative) flips the near-ties of untrained
# scores: this test's runs on an H200 agreed on 99.5% of voxels (compiled and eager; full size on a whole phantom:
# 99.4%). 97% allowed.
CPU_AGREEMENT = 0.999
GPU_AGREEMENT = 0.97
# Compiling SwinUNETR with Inductor on two shared CPU cores took 260 s (measured), more than a test may take here. So on
# a CPU the compiled run uses the aot_eager backend unless this is set to 1: Dynamo still captures the network the
# overlay compiles (after the strict weight load, graph breaks, guards) and AOTAutograd still traces it; only
# Inductor's C++ code generation is skipped (as tests/samples/test_sample_pancreas_dints.py does for DiNTS).
CPU_COMPILE_OPT_IN = "ROCM_ZOO_CPU_COMPILE"
NO_CODEGEN = {"TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager"}
IMG_SIZE_ERROR = "unexpected keyword argument 'img_size'"


def test_tiny_changes_only_the_size_keys():
    tiny, full = flatten_config(sample.inference_config("tiny")), flatten_config(sample.inference_config("full"))
    assert tiny.keys() == full.keys()
    assert {k for k in full if tiny[k] != full[k]} == {"network_def#img_size", "network_def#feature_size",
                                                        "inferer#roi_size", "preprocessing#transforms#3#pixdim"}


def test_full_config_is_upstreams():
    cfg = sample.inference_config("full")
    assert cfg["network_def"] == {"_target_": "SwinUNETR", "spatial_dims": 3, "img_size": 96, "in_channels": 1,
                                  "out_channels": 14, "feature_size": 48, "use_checkpoint": False}
    assert cfg["inferer"] == {"_target_": "SlidingWindowInferer", "roi_size": [96, 96, 96], "sw_batch_size": 4,
                              "overlap": 0.5}
    spacing = cfg["preprocessing"]["transforms"][3]
    assert (spacing["_target_"], spacing["pixdim"]) == ("Spacingd", [1.5, 1.5, 2.0])
    assert cfg["evaluator"]["amp"] is True
    assert sample.network_input_shape("full") == (4, 1, 96, 96, 96)
    assert sample.network_input_shape("tiny") == (4, 1, 64, 64, 64)
    meta = sample.metadata("full")
    assert SAMPLE_MARK in meta["version"] and "SAMPLE" in meta["description"]
    assert meta["network_data_format"]["outputs"]["pred"]["channel_def"]["13"] == "Left adrenal gland"


def test_full_network_is_the_real_size():
    assert sum(p.numel() for p in sample.build_network("full").parameters()) == 62_187_296  # 62.2 M, as upstream


def test_monai_rejects_upstreams_img_size():
    with pytest.raises(TypeError, match="img_size"):
        SwinUNETR(img_size=64, in_channels=1, out_channels=14, feature_size=12)


def test_compat_drops_img_size_and_keeps_the_rest(caplog):
    kwargs = {k: v for k, v in sample.inference_config("tiny")["network_def"].items() if k != "_target_"}
    with caplog.at_level(logging.INFO, logger="rocm_zoo.engine.compat"):
        with_img_size = swin_unetr(**kwargs)
    assert "dropped img_size=64" in caplog.text
    without = swin_unetr(**{k: v for k, v in kwargs.items() if k != "img_size"})
    shapes = {k: v.shape for k, v in with_img_size.state_dict().items()}
    assert shapes == {k: v.shape for k, v in without.state_dict().items()}
    assert sum(p.numel() for p in with_img_size.parameters()) == sum(p.numel() for p in without.parameters())


def test_written_bundle_loads_strictly(tmp_path):
    bundle = write_sample_bundle(tmp_path, sample, "tiny")
    assert sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()) == [
        "configs/inference.json", "configs/metadata.json", "configs/train.json", "models/model.pt"]
    load_weights(sample.build_network("tiny"), bundle / "models" / "model.pt")


# --- the bundle's own workflow: python -m monai.bundle run -------------------------------------------------------


@dataclass(frozen=True)
class BundleCli:
    """A bundle folder with the overlay in its configs/ and a dataset in the upstream datalist's layout."""

    root: Path
    bundle: Path
    image: Path
    env: dict

    def run(self, out: str, configs: list[str], *overrides: str,
            env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
        """`python -m monai.bundle run` from inside the bundle, as the Model Zoo and AMD's overlays document it."""
        cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", repr(configs), "--bundle_root", ".",
               "--dataset_dir", str(self.image.parents[1]), "--output_dir", str(self.root / out), *overrides]
        done = subprocess.run(cmd, cwd=self.bundle, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=900,
                              check=False)
        return done, self.root / out / SPEC.name / f"{SPEC.name}_trans.nii.gz"


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> BundleCli:
    root = tmp_path_factory.mktemp("swin_cli")
    bundle = write_sample_bundle(root, sample, "tiny")
    shutil.copy(OVERLAY, bundle / "configs")
    image = root / "data" / "imagesTs" / f"{SPEC.name}.nii.gz"
    phantom.write_phantom(phantom.make_phantom(SPEC), image, root / "truth" / f"{SPEC.name}.nii.gz")
    return BundleCli(root, bundle, image, dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(root / "inductor")))


def _label(done: subprocess.CompletedProcess, path: Path) -> np.ndarray:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return np.asarray(nib.load(path).dataobj)


@pytest.fixture(scope="module")
def baseline(cli) -> np.ndarray:
    """fp32 eager: the bundle config alone, with its `img_size` quirk fixed and without its `amp: true` (fp16 autocast
    on CUDA; a no-op on a CPU), on the command line."""
    fix = ["--network_def#_target_", "rocm_zoo.engine.compat.swin_unetr", "--evaluator#amp", "False"]
    return _label(*cli.run("baseline", ["configs/inference.json"], *fix))


@pytest.mark.slow
def test_bundle_config_alone_fails_on_img_size(cli):
    done, _ = cli.run("alone", ["configs/inference.json"])
    assert done.returncode != 0
    assert IMG_SIZE_ERROR in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_overlay_run_agrees_with_fp32_baseline(cli, baseline, compiled):
    on_gpu = torch.cuda.is_available()
    no_codegen = compiled and not on_gpu and os.environ.get(CPU_COMPILE_OPT_IN) != "1"
    overrides = [] if compiled else ["--rocm_overlay#compile", "False"]
    configs = ["configs/inference.json", "configs/inference_rocm.json"]
    done, path = cli.run(f"overlay_{'compiled' if compiled else 'eager'}", configs, *overrides,
                         env=NO_CODEGEN if no_codegen else None)
    label = _label(done, path)
    assert IMG_SIZE_ERROR not in done.stdout + done.stderr
    assert "dropped img_size=64" in done.stderr  # the shim says what it changed
    assert label.shape == baseline.shape == nib.load(cli.image).shape
    assert len(np.unique(baseline)) >= 2, "a one-class baseline would make the agreement below meaningless"
    assert (label == baseline).mean() >= (GPU_AGREEMENT if on_gpu else CPU_AGREEMENT)
