"""OHIF v3 (the viewer inside the monailabel wheel) in headless Chromium against the real PACS and server: the viewer
opens the phantom study from Orthanc, the MONAI Label panel connects, an automatic segmentation (wholeBody_ct) and a
VISTA3D point prompt on the spleen run, and each segmentation appears in the viewer (the axial viewport's pixels
change where the overlay is drawn). Screenshots and timings are kept in test-artifacts/ohif/."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

from rocm_zoo import phantom
from rocm_zoo.dicom_series import lps_affine

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ohif"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MIN_CHANGED_PIXELS = 200  # an overlay of a few organ voxels at this zoom is thousands of pixels
TIMEOUT_MS = 300_000


@pytest.fixture(scope="module")
def page(pacs_server):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra (scripts/setup-venv)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        # The panel's server address; its default is port 8000 of the page's host.
        context.add_cookies([{"name": "MONAILABEL_SERVER_URL", "value": pacs_server.url + "/", "url": pacs_server.url}])
        yield context.new_page()
        browser.close()


def _axial_pixels(page) -> np.ndarray:
    from PIL import Image

    shot = page.locator("[data-viewport-uid]").first.screenshot()
    return np.asarray(Image.open(io.BytesIO(shot)).convert("RGB")).astype(np.int16)


def _changed(before: np.ndarray, after: np.ndarray) -> int:
    return int((np.abs(after - before).max(-1) > 30).sum())


def _run_and_wait(page, button_title: str, success: str) -> float:
    start = time.perf_counter()
    page.locator(f"button[title='{button_title}']").click()
    page.get_by_text(success).first.wait_for(timeout=TIMEOUT_MS)
    seconds = time.perf_counter() - start
    page.wait_for_timeout(300)  # the overlay is drawn on the next frame
    return seconds


def _spleen_click(page, spec: phantom.PhantomSpec) -> tuple[float, float]:
    """Page coordinates of a spleen voxel on the axial slice on screen (from the phantom's truth and the viewport's
    own world-to-canvas transform)."""
    ph = phantom.make_phantom(spec)
    affine = lps_affine(ph.affine)
    focal = page.evaluate(
        "() => window.cornerstone.getRenderingEngines()[0].getViewport('mpr-axial').getCamera().focalPoint")
    k = int(round((np.linalg.inv(affine) @ [*focal, 1])[2]))
    ii, jj = np.nonzero(ph.truth[:, :, k] == phantom.ORGAN_LABELS["spleen"])
    assert len(ii), f"no spleen on axial slice {k}"
    nearest = int(np.argmin((ii - ii.mean()) ** 2 + (jj - jj.mean()) ** 2))
    world = (affine @ [ii[nearest], jj[nearest], k, 1])[:3].tolist()
    return tuple(page.evaluate(
        """w => { const v = window.cornerstone.getRenderingEngines()[0].getViewport('mpr-axial');
                  const r = v.element.getBoundingClientRect(); const c = v.worldToCanvas(w);
                  return [r.x + c[0], r.y + c[1]]; }""", world))


def test_ohif_opens_the_study_segments_and_shows_the_masks(page, pacs_server, local_pacs):
    spec = local_pacs.specs[0]
    study, _ = local_pacs.uids[spec.name]
    timings: dict[str, list[float]] = {"auto_wholeBody_ct_s": [], "point_vista3d_s": []}

    page.goto(f"{pacs_server.url}/ohif/monai-label?StudyInstanceUIDs={study}")
    page.wait_for_selector("[data-viewport-uid] canvas", timeout=TIMEOUT_MS)
    banner = page.get_by_text("Confirm and Hide")
    if banner.count():
        banner.first.click()
    page.get_by_text(spec.name).first.wait_for(timeout=60_000)  # series description from the PACS
    page.wait_for_timeout(1500)
    page.screenshot(path=ARTIFACTS / "1-study-open.png")
    blank = _axial_pixels(page)
    assert (blank.max(-1) > 60).sum() > 1000, "the CT slice is not drawn"

    page.locator("#monailabelServerURL").locator("xpath=following::button[1]").click()
    page.get_by_text("Connected to MONAI Label - Successful").first.wait_for(timeout=60_000)
    page.screenshot(path=ARTIFACTS / "2-panel-connected.png")

    page.locator("select.selectBox").first.select_option("wholeBody_ct")
    for run in range(2):  # first and repeated
        timings["auto_wholeBody_ct_s"].append(
            _run_and_wait(page, "Run Segmentation", "Running Segmentation - Successful"))
        page.screenshot(path=ARTIFACTS / f"3-auto-segmentation-{run + 1}.png")
        assert _changed(blank, _axial_pixels(page)) > MIN_CHANGED_PIXELS, "no segmentation drawn in the viewer"
        page.get_by_text("Running Segmentation - Successful").first.wait_for(state="hidden", timeout=30_000)

    # A fresh page state for the point prompt: the auto result is replaced by the VISTA3D mask of one class.
    page.get_by_text("Point Prompts", exact=True).click()
    page.locator("tr.clickable-row", has_text="spleen").first.click()
    page.mouse.click(*_spleen_click(page, spec))
    page.wait_for_timeout(300)
    clicked = _axial_pixels(page)
    page.screenshot(path=ARTIFACTS / "4-spleen-click.png")
    for run in range(2):
        timings["point_vista3d_s"].append(_run_and_wait(
            page, "Run PointPrompts", "Running Inference for Point Prompts - Successful"))
        page.screenshot(path=ARTIFACTS / f"5-vista3d-point-{run + 1}.png")
        page.get_by_text("Running Inference for Point Prompts - Successful").first.wait_for(state="hidden",
                                                                                            timeout=30_000)
    assert _changed(clicked, _axial_pixels(page)) > MIN_CHANGED_PIXELS, "no VISTA3D mask drawn in the viewer"
    (ARTIFACTS / "timings.json").write_text(json.dumps(
        {"study": spec.name, "shape": list(spec.shape), "timings": timings,
         "what": "seconds from clicking Run in the OHIF MONAI Label panel to its success notification"}, indent=2))
