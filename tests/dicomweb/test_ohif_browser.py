"""OHIF v3 (the viewer inside the monailabel wheel) in headless Chromium against the real PACS and server: the viewer
opens the phantom study from Orthanc, the MONAI Label panel connects, an automatic segmentation (wholeBody_ct) and a
VISTA3D point prompt on the spleen run, and each segmentation appears in the viewer (the axial viewport's pixels
change where the overlay is drawn). Screenshots and timings are kept in test-artifacts/ohif/. The browser steps are
rocm_zoo.bench.ohif_driver's, which `rocm-zoo bench-ohif` times on the spleen_10-shaped phantom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocm_zoo.bench import ohif_driver as ohif
from pacs_unavailable import unavailable

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ohif"


@pytest.fixture(scope="module")
def page(pacs_server):
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("playwright is not installed (the test extra: scripts/setup-venv)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with ohif.browser_page(pacs_server.url) as page:
            yield page
    except ohif.OhifUnavailable as e:
        unavailable(str(e))


def test_ohif_opens_the_study_segments_and_shows_the_masks(page, pacs_server, local_pacs):
    spec = local_pacs.specs[0]
    study, _ = local_pacs.uids[spec.name]
    timings: dict[str, list[float]] = {"auto_wholeBody_ct_s": [], "point_vista3d_s": []}

    blank = ohif.open_study(page, pacs_server.url, study, spec.name)
    page.screenshot(path=ARTIFACTS / "1-study-open.png")
    assert (blank.max(-1) > 60).sum() > 1000, "the CT slice is not drawn"

    ohif.connect_panel(page)
    page.screenshot(path=ARTIFACTS / "2-panel-connected.png")

    ohif.select_auto_model(page, "wholeBody_ct")
    for run in range(2):  # first and repeated
        timings["auto_wholeBody_ct_s"].append(ohif.run_and_wait(page, ohif.AUTO))
        page.screenshot(path=ARTIFACTS / f"3-auto-segmentation-{run + 1}.png")
        assert ohif.changed(blank, ohif.axial_pixels(page)) > ohif.MIN_CHANGED_PIXELS, "no segmentation drawn"
        ohif.wait_notification_gone(page, ohif.AUTO)

    # A fresh page state for the point prompt: the auto result is replaced by the VISTA3D mask of one class.
    ohif.place_point(page, "spleen", spec)
    clicked = ohif.axial_pixels(page)
    page.screenshot(path=ARTIFACTS / "4-spleen-click.png")
    for run in range(2):
        timings["point_vista3d_s"].append(ohif.run_and_wait(page, ohif.POINT))
        page.screenshot(path=ARTIFACTS / f"5-vista3d-point-{run + 1}.png")
        ohif.wait_notification_gone(page, ohif.POINT)
    assert ohif.changed(clicked, ohif.axial_pixels(page)) > ohif.MIN_CHANGED_PIXELS, "no VISTA3D mask drawn"
    (ARTIFACTS / "timings.json").write_text(json.dumps(
        {"study": spec.name, "shape": list(spec.shape), "timings": timings,
         "what": "seconds from clicking Run in the OHIF MONAI Label panel to its success notification"}, indent=2))
