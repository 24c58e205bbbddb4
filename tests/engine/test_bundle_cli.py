"""The overlay file also drives the bundle's own workflow, as AMD's ROCm overlays do:
`python -m monai.bundle run --config_file "['configs/inference.json','configs/inference_rocm.json']"`."""

from __future__ import annotations

import shutil
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from rocm_zoo.engine.masks import dice
from rocm_zoo.engine.overlay import OVERLAYS_DIR

pytestmark = pytest.mark.slow
BUNDLE = "spleen_deepedit_annotation"


def test_monai_bundle_run_with_the_overlay(sample_env, tmp_path):
    bundle = tmp_path / BUNDLE
    shutil.copytree(sample_env.paths.model_dir / BUNDLE, bundle)
    shutil.copy(OVERLAYS_DIR / BUNDLE / "inference_rocm.json", bundle / "configs")
    (tmp_path / "data" / "imagesTs").mkdir(parents=True)
    shutil.copy(sample_env.image_path("phantom_test2"), tmp_path / "data" / "imagesTs")
    cmd = [sys.executable, "-m", "monai.bundle", "run",
           "--config_file", "['configs/inference.json','configs/inference_rocm.json']",
           "--bundle_root", ".", "--dataset_dir", str(tmp_path / "data"), "--output_dir", str(tmp_path / "out")]
    run = subprocess.run(cmd, cwd=bundle, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "out" / "phantom_test2" / "phantom_test2_trans.nii.gz"
    pred = np.asarray(nib.load(out).dataobj)
    truth = sample_env.truth("phantom_test2") == 1
    assert pred.shape == truth.shape
    # no clicks in this workflow: the automatic mode; the strict checkpoint load into the overlay's network is what
    # makes this pass (random weights give Dice ~0)
    assert dice(pred == 1, truth) >= 0.75
