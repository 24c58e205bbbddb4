"""Tests for the synthetic abdominal CT phantoms (fast, CPU only)."""

from __future__ import annotations

import dataclasses

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from rocm_zoo.engine import atomic_files
from rocm_zoo.samples import phantom

L = phantom.ORGAN_LABELS


@pytest.fixture(scope="module")
def phantoms() -> list[phantom.Phantom]:
    return [phantom.make_phantom(spec) for spec in phantom.test_specs()]


def _world_centroid(ph: phantom.Phantom, label: int) -> np.ndarray:
    idx = np.argwhere(ph.truth == label).mean(axis=0)
    return ph.affine[:3, :3] @ idx + ph.affine[:3, 3]


def _volume_ml(ph: phantom.Phantom, label: int) -> float:
    return float((ph.truth == label).sum() * np.prod(ph.spec.spacing) / 1000.0)


def test_labels_and_specs() -> None:
    assert L == {"spleen": 1, "right_kidney": 2, "left_kidney": 3, "liver": 4, "aorta": 5,
                 "pancreas": 6, "spine": 7, "muscle": 8, "fat": 9}
    tests, train = phantom.test_specs(3), phantom.training_specs(20)
    assert tests == phantom.test_specs(3) and train == phantom.training_specs(20)
    assert len({s.seed for s in tests}) == 3 and len({s.seed for s in train}) == 20
    assert not {s.seed for s in tests} & {s.seed for s in phantom.training_specs(200)}
    assert len({(s.shape, s.spacing) for s in train}) > 5
    for spec in tests + train:
        fov = np.multiply(spec.shape, spec.spacing)
        assert np.all(fov[:2] >= 395) and np.all(fov[:2] <= 470), spec  # body is at most ~385 mm wide
    with pytest.raises(ValueError):
        phantom.PhantomSpec("x", (8, 8, 8), (1.0, 1.0, 1.0), seed=0, orientation="LAS")


def test_deterministic_and_typed(phantoms: list[phantom.Phantom]) -> None:
    for ph in phantoms:
        again = phantom.make_phantom(ph.spec)
        assert ph.image.dtype == np.int16 and ph.truth.dtype == np.uint8
        assert ph.image.shape == ph.truth.shape == ph.spec.shape
        assert np.array_equal(ph.image, again.image) and np.array_equal(ph.truth, again.truth)
        assert np.array_equal(ph.affine, again.affine)
        assert nib.aff2axcodes(ph.affine) == ("R", "A", "S")
        assert set(np.unique(ph.truth)) == {0, *L.values()}
    assert not np.array_equal(phantoms[0].truth[:96, :96, :36], phantoms[1].truth[:96, :96, :36])


def test_spleen_volume_and_extent(phantoms: list[phantom.Phantom]) -> None:
    for ph in phantoms:
        # ~100 x 56 x 104 mm ellipsoid (~300 mL) jittered +-10% per axis, minus what the kidney takes.
        assert 150 <= _volume_ml(ph, L["spleen"]) <= 450
        z = np.nonzero((ph.truth == L["spleen"]).any(axis=(0, 1)))[0]
        assert z.min() > 0 and z.max() < ph.spec.shape[2] - 1, "spleen must lie fully inside in z"


def test_same_anatomy_at_another_resolution(phantoms: list[phantom.Phantom]) -> None:
    coarse = phantoms[0]
    fine = phantom.make_phantom(dataclasses.replace(coarse.spec, shape=(200, 200, 40), spacing=(2.0, 2.0, 5.0)))
    for name in ("spleen", "liver", "right_kidney"):
        # Same shapes in mm; only the voxelisation of the surface differs (~1 voxel shell at 4 mm).
        assert _volume_ml(fine, L[name]) == pytest.approx(_volume_ml(coarse, L[name]), rel=0.08)
        assert np.allclose(_world_centroid(fine, L[name]), _world_centroid(coarse, L[name]), atol=3.0)


def test_laterality(phantoms: list[phantom.Phantom]) -> None:
    # nibabel RAS+: +x is the patient's RIGHT, so the spleen (patient's left) has world x < 0.
    for ph in phantoms:
        spleen, liver = _world_centroid(ph, L["spleen"]), _world_centroid(ph, L["liver"])
        right, left = _world_centroid(ph, L["right_kidney"]), _world_centroid(ph, L["left_kidney"])
        spine, aorta = _world_centroid(ph, L["spine"]), _world_centroid(ph, L["aorta"])
        assert spleen[0] < -50 and liver[0] > 30 and right[0] > 0 > left[0]
        assert spleen[1] < liver[1] and spine[1] < aorta[1] < 0 and aorta[0] < 0


def test_mean_hu_per_organ(phantoms: list[phantom.Phantom]) -> None:
    # One voxel of erosion removes the partial-volume shell (blur sigma <= 0.6 voxel). What is left
    # differs from nominal by noise (15 HU / sqrt(n) < 2 HU) plus blur tails from neighbours; over
    # 230 seeds the worst was 6 HU, hence 8 HU. The aorta core is only ~2 voxels wide with -90 HU fat
    # around it and its tail reached 9.6 HU, hence 15 HU.
    for ph in phantoms:
        for name in ("spleen", "right_kidney", "left_kidney", "liver", "aorta", "pancreas", "muscle"):
            core = ndimage.binary_erosion(ph.truth == L[name])
            assert core.sum() > 20, name
            tol = 15 if name == "aorta" else 8
            assert ph.image[core].mean() == pytest.approx(phantom.NOMINAL_HU[L[name]], abs=tol), name
        fat = ph.image[ndimage.binary_erosion(ph.truth == L["fat"])].mean()
        assert -105 < fat < -85  # subcutaneous -100, visceral -90
        assert ph.image[ndimage.binary_erosion(ph.truth == L["spine"])].mean() > 400
        assert ph.image[ndimage.binary_erosion(ph.truth == 0, iterations=2)].mean() < -990


def test_lps_matches_ras_after_canonical(phantoms: list[phantom.Phantom], tmp_path) -> None:
    ras = phantoms[2]  # non-square in-plane, so a wrong axis flip would show
    lps = phantom.make_phantom(dataclasses.replace(ras.spec, orientation="LPS"))
    assert nib.aff2axcodes(lps.affine) == ("L", "P", "S")
    phantom.write_phantom(lps, tmp_path / "img.nii.gz", tmp_path / "lbl.nii.gz")
    for name, expected in (("img", ras.image), ("lbl", ras.truth)):
        canon = nib.as_closest_canonical(nib.load(tmp_path / f"{name}.nii.gz"))
        assert np.array_equal(np.asanyarray(canon.dataobj), expected)
        assert np.allclose(canon.affine, ras.affine, atol=1e-4)


def test_write_round_trip(phantoms: list[phantom.Phantom], tmp_path) -> None:
    ph = phantoms[1]
    out = tmp_path / "sub"
    phantom.write_phantom(ph, out / "img.nii.gz", out / "lbl.nii.gz")
    assert sorted(p.name for p in out.iterdir()) == ["img.nii.gz", "lbl.nii.gz"]  # no temp files left
    img, lbl = nib.load(out / "img.nii.gz"), nib.load(out / "lbl.nii.gz")
    assert np.array_equal(np.asanyarray(img.dataobj), ph.image) and img.get_data_dtype() == np.int16
    assert np.array_equal(np.asanyarray(lbl.dataobj), ph.truth) and lbl.get_data_dtype() == np.uint8
    for loaded in (img, lbl):
        assert np.allclose(loaded.affine, ph.affine, atol=1e-5)  # header stores float32
        assert loaded.header.get_zooms() == pytest.approx(ph.spec.spacing)
        assert int(loaded.header["sform_code"]) == 1


def test_write_failure_leaves_no_partial_file(phantoms: list[phantom.Phantom], tmp_path, monkeypatch) -> None:
    target = tmp_path / "img.nii.gz"
    target.write_bytes(b"previous")

    def full_disk(fd) -> None:  # the temporary file is written; flushing it to the disk fails
        raise OSError("disk full")

    monkeypatch.setattr(atomic_files.os, "fsync", full_disk)
    with pytest.raises(OSError, match="disk full"):
        phantom.write_phantom(phantoms[0], target, tmp_path / "lbl.nii.gz")
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["img.nii.gz"]


def test_spleen10_spacing_small_crop() -> None:
    spec = dataclasses.replace(phantom.SPLEEN10, shape=(48, 40, 6))
    ph = phantom.make_phantom(spec)
    assert phantom.SPLEEN10.shape == (512, 512, 55) and phantom.SPLEEN10.spacing == (0.98, 0.98, 5.0)
    assert np.allclose(np.diag(ph.affine)[:3], spec.spacing)
    assert np.allclose(ph.affine[:3, :3] @ (np.array(spec.shape) - 1) / 2 + ph.affine[:3, 3], 0)  # centred
    # A 47 x 39 mm window around the world origin: inside the abdomen and holding the aorta.
    assert L["aorta"] in ph.truth and 0 not in ph.truth


def test_written_phantoms_are_readable_by_everyone(phantoms: list[phantom.Phantom], tmp_path) -> None:
    image, truth = tmp_path / "img.nii.gz", tmp_path / "lbl.nii.gz"
    phantom.write_phantom(phantoms[0], image, truth)
    for path in (image, truth):
        assert path.stat().st_mode & 0o777 == 0o644  # the server and its users read the sample data
    assert np.array_equal(np.asarray(nib.load(str(truth)).dataobj), phantoms[0].truth)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img.nii.gz", "lbl.nii.gz"]
