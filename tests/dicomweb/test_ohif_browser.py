"""OHIF v3 (the viewer inside the monailabel wheel) in headless Chromium against the real server: the viewer opens
the phantom study from Orthanc, the MONAI Label panel connects, an automatic segmentation (wholeBody_ct) and a
VISTA3D point prompt on the spleen run, twice each, and each result is drawn in the axial viewport where it lies. The
same, once each, with no PACS at all: a server on a studies folder of NIfTI files, as `scripts/run-server` starts
it, answers the viewer's DICOMweb reads itself (`dicomweb.local_series`).

Where: the check does not rest on what the sample networks learnt (phantom-trained, not clinical). The reference is
the label the server gives for the request the page sent (replayed through REST as NIfTI), its voxels on the slice
on screen projected through the viewport's own world-to-canvas transform; the pixels that changed must lie on them
(bounding box, centroid, coverage). The VISTA3D mask must also be at the click, which is on the phantom's spleen (its
truth projected the same way). Each run is compared with a screenshot taken just before it, with the previous result
removed from OHIF's labelmap, so a second run has to draw again. Screenshots and timings are kept in
test-artifacts/ohif/. The browser steps are rocm_zoo.bench.ohif_driver's, which `rocm-zoo bench-ohif` times on the
spleen_10-shaped phantom."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import pytest
import requests

from rocm_zoo.bench import ohif_driver as ohif
from rocm_zoo.dicom_volume import local_series_uids
from rocm_zoo.dicomweb.dicom_seg import read_label
from rocm_zoo.samples import phantom
from pacs_unavailable import unavailable
from zoo_test_support import monailabel_server

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ohif"
COVERED = 0.9  # of the reference voxels on the slice on screen with changed pixels in their square
FAINT_CHANGE = 8  # grey levels (0-255) of a pixel that a label's fill changed
# The panel's own result options: NRRD for the browser; the replay asks for the same label as NIfTI.
BROWSER_ONLY_PARAMS = ("result_extension", "result_dtype", "result_compress")
FOLDER_MODELS = "wholeBody_ct,vista3d"  # the two the viewer runs
# The PACS test's first phantom, as a NIfTI file in a studies folder: the same checks on the same voxels.
FOLDER_SPEC = phantom.PhantomSpec("folder_ras", (64, 60, 24), (5.0, 5.2, 6.0), seed=2_000_001)


@contextmanager
def _browser(server_url: str):
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("playwright is not installed (the test extra: scripts/setup-venv)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with ohif.browser_page(server_url) as page:
            yield page
    except ohif.OhifUnavailable as e:
        unavailable(str(e))


@pytest.fixture
def page(pacs_server):
    # Closed after its test: Playwright's sync API cannot start a second browser (the folder test's) while one runs.
    with _browser(pacs_server.url) as page:
        yield page


@pytest.fixture(scope="module")
def folder_server(sample_env, tmp_path_factory):
    """The server on a studies folder holding one phantom's NIfTI file: no PACS anywhere."""
    root = tmp_path_factory.mktemp("ohif_folder")
    spec = FOLDER_SPEC
    phantom.write_phantom(phantom.make_phantom(spec), root / "studies" / f"{spec.name}.nii.gz",
                          root / "truth" / f"{spec.name}.nii.gz")
    with monailabel_server(sample_env.app_dir, str(root / "studies"), FOLDER_MODELS, root / "server.log", cwd=root,
                           timeout_s=900, env={"TORCHINDUCTOR_CACHE_DIR": str(sample_env.root / "inductor")}) as url:
        yield url, spec


def _replayed_label(server_url: str, sent: tuple[str, dict], path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The label (and its RAS affine) the server gives for the infer request the page sent, as NIfTI."""
    url, params = sent
    parts = urlsplit(url)
    model = unquote(parts.path.rsplit("/infer/", 1)[1])
    image = parse_qs(parts.query)["image"][0]
    params = {k: v for k, v in params.items() if k not in BROWSER_ONLY_PARAMS}
    r = requests.post(f"{server_url}/infer/{model}", params={"image": image, "output": "image"},
                      files={"params": (None, json.dumps(params))}, timeout=900)
    assert r.status_code == 200, r.text[:2000]
    path.write_bytes(r.content)
    return read_label(str(path))


def _assert_drawn_on(page, before: np.ndarray, after: np.ndarray, label, affine, what: str) -> np.ndarray:
    """The pixels that changed from `before` to `after` lie on `label`'s voxels of the slice on screen; returns
    their page coordinates (n, 2)."""
    points, voxel_px = ohif.slice_points(page, label, affine)
    assert len(points), f"{what}: the server's label has no voxel on the slice on screen"
    mask = ohif.changed_mask(before, after)
    assert mask.sum() > ohif.MIN_CHANGED_PIXELS, f"{what}: no segmentation drawn ({mask.sum()} pixels changed)"
    x0, y0 = ohif.axial_origin(page)
    rows, cols = np.nonzero(mask)
    drawn = np.stack([cols + x0 + 0.5, rows + y0 + 0.5], 1)
    margin = voxel_px / 2 + 3  # a voxel's half width and the outline
    lo, hi = points.min(0) - margin, points.max(0) + margin
    outside = ~((drawn >= lo) & (drawn <= hi)).all(1)
    assert outside.mean() < 0.01, (f"{what}: {outside.sum()} of {len(drawn)} changed pixels lie outside the label's "
                                   f"box {lo.round(1).tolist()}..{hi.round(1).tolist()} (page px)")
    # Where it is drawn, one vote per voxel square with changed pixels: a pixel mean would weigh each organ by how
    # much its colour changes the grey under it (a fill close to the tissue's grey leaves only its outline).
    # OHIF's segmentation icons appear in the viewport's corner with the first result: the few changed pixels
    # outside the label's box (bounded above) are not part of the mask drawn.
    cells = np.unique(np.round((drawn[~outside] - points[0]) / voxel_px).astype(int), axis=0)
    shift = np.linalg.norm(points[0] + cells.mean(0) * voxel_px - points.mean(0))
    assert shift < 2 * voxel_px, f"{what}: drawn {shift:.1f} px from where the label is (voxel {voxel_px:.1f} px)"
    # A voxel is drawn when changed pixels fall inside its square on screen: fill or outline. A fill changes the grey
    # under it faintly where the label colour is close to the tissue's (measured: the spleen's pink over the spleen,
    # 21-39 levels), so any change counts here; the page renders the same slice identically, so elsewhere none does.
    filled = np.abs(after.astype(int) - before.astype(int)).max(-1) > FAINT_CHANGE
    half = max(int(voxel_px / 2), 1)
    ij = np.floor(points - [x0, y0]).astype(int)
    covered = np.mean([filled[max(j - half, 0):j + half + 1, max(i - half, 0):i + half + 1].any() for i, j in ij])
    assert covered >= COVERED, f"{what}: only {covered:.0%} of the label's voxels on screen are drawn"
    return drawn


def _cleared(page, blank: np.ndarray) -> np.ndarray:
    """The axial viewport with the previous result removed (OHIF's labelmap emptied and redrawn)."""
    ohif.clear_segmentation(page)
    shown = ohif.axial_pixels(page)
    assert ohif.changed(blank, shown) < ohif.MIN_CHANGED_PIXELS, "the previous result is still drawn"
    return shown


def test_ohif_opens_the_study_segments_and_shows_the_masks(page, pacs_server, local_pacs, tmp_path):
    spec = local_pacs.specs[0]
    study, _ = local_pacs.uids[spec.name]
    _segments_and_shows(page, pacs_server.url, spec, study, tmp_path, runs=2, artifacts=ARTIFACTS)


def test_ohif_on_a_studies_folder_without_a_pacs(folder_server, tmp_path):
    url, spec = folder_server
    study, _ = local_series_uids(spec.name)
    with _browser(url) as page:
        _segments_and_shows(page, url, spec, study, tmp_path, runs=1, artifacts=ARTIFACTS / "folder")


def _segments_and_shows(page, server_url: str, spec, study: str, tmp_path: Path, runs: int, artifacts: Path) -> None:
    """Opens the study, connects the panel, runs wholeBody_ct and a VISTA3D spleen point `runs` times each, and
    checks each result is drawn where the server's label lies (the point's at the click)."""
    artifacts.mkdir(parents=True, exist_ok=True)
    timings: dict[str, list[float]] = {"auto_wholeBody_ct_s": [], "point_vista3d_s": []}
    sent = ohif.record_infer_requests(page)

    blank = ohif.open_study(page, server_url, study, spec.name)
    page.screenshot(path=artifacts / "1-study-open.png")
    assert (blank.max(-1) > 60).sum() > 1000, "the CT slice is not drawn"

    ohif.connect_panel(page)
    page.screenshot(path=artifacts / "2-panel-connected.png")

    ohif.select_auto_model(page, "wholeBody_ct")
    for run in range(runs):  # first and repeated
        before = blank if run == 0 else _cleared(page, blank)
        timings["auto_wholeBody_ct_s"].append(ohif.run_and_wait(page, ohif.AUTO))
        page.screenshot(path=artifacts / f"3-auto-segmentation-{run + 1}.png")
        ohif.wait_notification_gone(page, ohif.AUTO)
        assert sent and "/infer/wholeBody_ct" in sent[-1][0], sent
        label, affine = _replayed_label(server_url, sent[-1], tmp_path / f"auto-{run}.nii.gz")
        _assert_drawn_on(page, before, ohif.axial_pixels(page), label, affine, f"wholeBody_ct run {run + 1}")

    # The point prompt on a viewport without the auto result: its mask is VISTA3D's of one class, at the click.
    blank = _cleared(page, blank)
    click = np.asarray(ohif.place_point(page, "spleen", spec))
    clicked = ohif.axial_pixels(page)
    page.screenshot(path=artifacts / "4-spleen-click.png")
    for run in range(runs):
        before = clicked if run == 0 else _cleared(page, clicked)
        timings["point_vista3d_s"].append(ohif.run_and_wait(page, ohif.POINT))
        page.screenshot(path=artifacts / f"5-vista3d-point-{run + 1}.png")
        ohif.wait_notification_gone(page, ohif.POINT)
        assert "/infer/vista3d" in sent[-1][0], sent[-1]
        label, affine = _replayed_label(server_url, sent[-1], tmp_path / f"point-{run}.nii.gz")
        drawn = _assert_drawn_on(page, before, ohif.axial_pixels(page), label, affine, f"VISTA3D point run {run + 1}")
        points, voxel_px = ohif.slice_points(page, label, affine)
        # VISTA3D keeps the regions at (or, MONAI's rule, nearest to) the click
        assert np.linalg.norm(points - click, axis=1).min() < 2 * voxel_px, "the VISTA3D mask is not at the click"
        assert np.linalg.norm(drawn - click, axis=1).min() < 2 * voxel_px, "nothing is drawn at the click"
    (artifacts / "timings.json").write_text(json.dumps(
        {"study": spec.name, "shape": list(spec.shape), "timings": timings,
         "what": "seconds from clicking Run in the OHIF MONAI Label panel to its success notification"}, indent=2))
