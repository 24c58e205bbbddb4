"""`rocm-zoo bench-batch` on the CPU: MONAI Label's stock BundleInferTask and rocm_zoo's SegmentationTask segment the
same study file into label files, timed, and agree."""

from __future__ import annotations

import json

import pytest

from rocm_zoo.cli import main
from rocm_zoo.samples import phantom
from rocm_zoo.samples.bundles import write_sample_bundle

pytestmark = pytest.mark.slow


def test_stock_and_rocm_zoo_segment_the_same_study_alike(tmp_path):
    bundle = write_sample_bundle(tmp_path / "model", "wholeBody_ct_segmentation", "tiny")
    spec = phantom.test_specs(1)[0]
    image = tmp_path / "studies" / f"{spec.name}.nii.gz"
    phantom.write_phantom(phantom.make_phantom(spec), image, tmp_path / "truth" / f"{spec.name}.nii.gz")
    out = tmp_path / "out"
    assert main(["bench-batch", "--bundle-dir", str(bundle), "--image", str(image), "--repeats", "2",
                 "--device", "cpu", "--out", str(out)]) == 0
    record = json.loads((out / "batch.json").read_text())
    rows = {r["path"]: r for r in record["rows"]}
    assert set(rows) == {"stock", "rocm_zoo"}
    for row in rows.values():
        assert row["study_shape"] == list(spec.shape) and len(row["times_s"]) == 2 and row["p50_s"] > 0
        stages = row["stage_p50_s"]
        assert {"pre", "infer", "write"} <= set(stages) and 0 < stages["infer"] <= row["p50_s"], stages
    assert rows["stock"]["warm_s"] is None and rows["rocm_zoo"]["warm_s"] > 0
    # Untrained weights (105 nearly tied scores): fp32 eager on host transforms vs the overlay's path; on a CPU the
    # overlay's bf16 autocast, channels-last, compile and float16 stitching are what differ.
    assert rows["rocm_zoo"]["voxels_equal_to_stock"] >= 0.97, rows["rocm_zoo"]
    assert rows["stock"]["voxels_equal_to_stock"] == 1.0
    assert "| wholeBody_ct_segmentation |" in (out / "batch.md").read_text()
