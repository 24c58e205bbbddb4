"""OHIF v3 (the viewer inside the monailabel wheel) and its MONAI Label panel, driven in headless Chromium through
Playwright: open a study from the PACS, connect the panel, run a model and wait until its result is shown. Debian's
`chromium` only, never a downloaded browser. Used by the browser test and by `rocm-zoo bench-ohif`."""

from __future__ import annotations

import io
import json
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import lps_affine

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TIMEOUT_MS = 300_000
MIN_CHANGED_PIXELS = 200  # an overlay of a few organ voxels at this zoom is thousands of pixels
# (button title, notification once the result is shown) per panel tab
AUTO = ("Run Segmentation", "Running Segmentation - Successful")
POINT = ("Run PointPrompts", "Running Inference for Point Prompts - Successful")


class OhifUnavailable(RuntimeError):
    """No Chromium or no Playwright here; the message says what to install."""


@contextmanager
def browser_page(server_url: str) -> Iterator[Any]:
    """A Playwright page in headless Chromium with the panel's server address set (its default is port 8000 of the
    page's host)."""
    if not Path(CHROMIUM).exists():
        raise OhifUnavailable(f"no {CHROMIUM}: apt-get install -y chromium")
    try:
        from playwright import sync_api
    except ImportError as e:
        raise OhifUnavailable("playwright is not installed (the test extra: scripts/setup-venv)") from e
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            context.add_cookies([{"name": "MONAILABEL_SERVER_URL", "value": server_url + "/", "url": server_url}])
            yield context.new_page()
        finally:
            browser.close()


def record_infer_requests(page) -> list[tuple[str, dict]]:
    """From now on, every `/infer/` request the page sends, as (url, params), appended to the list returned."""
    sent: list[tuple[str, dict]] = []

    def on_request(request) -> None:
        if "/infer/" in request.url:
            sent.append((request.url, infer_params(request.post_data or "")))

    page.on("request", on_request)
    return sent


def infer_params(body: str) -> dict:
    """The `params` JSON of the panel's multipart infer request ({} when there is none)."""
    m = re.search(r'name="params"\r?\n\r?\n(.*?)\r?\n--', body, re.S)
    return json.loads(m.group(1)) if m else {}


def open_study(page, server_url: str, study: str, series_description: str) -> np.ndarray:
    """Opens the study in OHIF's MONAI Label mode and waits for the CT slice; returns the axial viewport's pixels.
    If the slice never shows, the error names the page's requests that failed."""
    failed: list[str] = []
    listeners = {
        "response": lambda r: failed.append(f"{r.status} {r.request.method} {r.url}") if r.status >= 400 else None,
        "requestfailed": lambda r: failed.append(f"failed ({r.failure}) {r.method} {r.url}"),
        "console": lambda m: failed.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    }
    for event, listener in listeners.items():
        page.on(event, listener)
    try:
        page.goto(f"{server_url}/ohif/monai-label?StudyInstanceUIDs={study}")
        page.wait_for_selector("[data-viewport-uid] canvas", timeout=TIMEOUT_MS)
    except Exception as e:
        raise AssertionError("OHIF showed no slice; what failed on the page:\n" + "\n".join(failed[:40])) from e
    finally:
        for event, listener in listeners.items():
            page.remove_listener(event, listener)
    banner = page.get_by_text("Confirm and Hide")
    if banner.count():
        banner.first.click()
    page.get_by_text(series_description).first.wait_for(timeout=60_000)  # series description from the PACS
    page.wait_for_timeout(1500)
    return axial_pixels(page)


def connect_panel(page) -> None:
    page.locator("#monailabelServerURL").locator("xpath=following::button[1]").click()
    page.get_by_text("Connected to MONAI Label - Successful").first.wait_for(timeout=60_000)


def select_auto_model(page, model: str) -> None:
    page.locator("select.selectBox").first.select_option(model)


def place_point(page, label: str, spec: phantom.PhantomSpec, organ: str = "spleen") -> tuple[float, float]:
    """Point Prompts tab, the class `label`, and one click on `organ` in the axial viewport; returns the click's page
    coordinates."""
    page.get_by_text("Point Prompts", exact=True).click()
    page.locator("tr.clickable-row", has_text=label).first.click()
    click = organ_click(page, spec, organ)
    page.mouse.click(*click)
    page.wait_for_timeout(300)
    return click


def axial_pixels(page) -> np.ndarray:
    from PIL import Image

    shot = page.locator("[data-viewport-uid]").first.screenshot()
    return np.asarray(Image.open(io.BytesIO(shot)).convert("RGB")).astype(np.int16)


def changed(before: np.ndarray, after: np.ndarray) -> int:
    return int(changed_mask(before, after).sum())


def changed_mask(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """(row, column) of the viewport screenshot: True where a pixel changed visibly."""
    return np.abs(after - before).max(-1) > 30


def axial_origin(page) -> tuple[float, float]:
    """Page coordinates of the top-left pixel of `axial_pixels`' screenshot."""
    box = page.locator("[data-viewport-uid]").first.bounding_box()
    return box["x"], box["y"]


def clear_segmentation(page) -> None:
    """Empties OHIF's labelmap (the one the MONAI Label panel writes results into) and redraws, so that the next
    result is drawn on a viewport without the previous one."""
    page.evaluate(
        """() => { const vol = window.services.segmentationService.getLabelmapVolume('1');
                   if (!vol) { return; }
                   const data = vol.voxelManager.getCompleteScalarDataArray();
                   vol.voxelManager.setCompleteScalarDataArray(new data.constructor(data.length));
                   const events = window.cornerstoneTools.segmentation.triggerSegmentationEvents;
                   if (events && events.triggerSegmentationDataModified) {
                     events.triggerSegmentationDataModified('1');
                   } else {
                     window.cornerstone.triggerEvent(window.cornerstone.eventTarget,
                       window.cornerstoneTools.Enums.Events.SEGMENTATION_DATA_MODIFIED, { segmentationId: '1' });
                   } }""")
    page.wait_for_timeout(500)


def slice_points(page, volume: np.ndarray, affine_ras: np.ndarray) -> tuple[np.ndarray, float]:
    """(page coordinates (n, 2) of the centres of `volume`'s nonzero voxels on the axial slice on screen, on-screen
    size of one voxel in pixels), through the viewport's own world-to-canvas transform."""
    affine = lps_affine(affine_ras)
    focal = page.evaluate(
        "() => window.cornerstone.getRenderingEngines()[0].getViewport('mpr-axial').getCamera().focalPoint")
    axis = int(np.argmax(np.abs(affine[2, :3])))  # the volume's axis along the patient's feet-head axis
    k = int(round((np.linalg.inv(affine) @ [*focal, 1])[axis]))
    in_plane = [a for a in range(3) if a != axis]
    index = np.zeros((3, 0), dtype=int)
    if 0 <= k < volume.shape[axis]:
        nonzero = np.nonzero(np.take(np.asarray(volume), k, axis=axis))
        index = np.zeros((3, len(nonzero[0])), dtype=int)
        index[in_plane[0]], index[in_plane[1]], index[axis] = nonzero[0], nonzero[1], k
    corner = np.zeros((3, 3), dtype=int)  # a voxel and its two in-plane neighbours: the voxel's size on screen
    corner[axis] = k
    corner[in_plane[0], 1] = corner[in_plane[1], 2] = 1
    world = (affine[:3, :3] @ np.concatenate([corner, index], 1) + affine[:3, 3:4]).T.tolist()
    canvas = np.asarray(page.evaluate(
        """ws => { const v = window.cornerstone.getRenderingEngines()[0].getViewport('mpr-axial');
                   const r = v.element.getBoundingClientRect();
                   return ws.map(w => { const c = v.worldToCanvas(w); return [r.x + c[0], r.y + c[1]]; }); }""",
        world), dtype=float).reshape(-1, 2)
    voxel_px = float(max(np.linalg.norm(canvas[1] - canvas[0]), np.linalg.norm(canvas[2] - canvas[0])))
    return canvas[3:], voxel_px


def run_and_wait(page, action: tuple[str, str]) -> float:
    """Seconds from clicking the tab's Run button to its success notification (the result is in the viewer then);
    waits one more frame for the overlay to be drawn (not counted)."""
    button, success = action
    start = time.perf_counter()
    page.locator(f"button[title='{button}']").click()
    page.get_by_text(success).first.wait_for(timeout=TIMEOUT_MS)
    seconds = time.perf_counter() - start
    page.wait_for_timeout(300)
    return seconds


def wait_notification_gone(page, action: tuple[str, str]) -> None:
    """The next Run is told apart from this one only once this success notification is gone."""
    page.get_by_text(action[1]).first.wait_for(state="hidden", timeout=30_000)


def organ_click(page, spec: phantom.PhantomSpec, organ: str = "spleen") -> tuple[float, float]:
    """Page coordinates of an `organ` voxel on the axial slice on screen (from the phantom's truth and the viewport's
    own world-to-canvas transform)."""
    ph = phantom.make_phantom(spec)
    affine = lps_affine(ph.affine)
    focal = page.evaluate(
        "() => window.cornerstone.getRenderingEngines()[0].getViewport('mpr-axial').getCamera().focalPoint")
    k = int(round((np.linalg.inv(affine) @ [*focal, 1])[2]))
    ii, jj = np.nonzero(ph.truth[:, :, k] == phantom.ORGAN_LABELS[organ])
    if not len(ii):
        raise ValueError(f"no {organ} on axial slice {k} of {spec.name}")
    nearest = int(np.argmin((ii - ii.mean()) ** 2 + (jj - jj.mean()) ** 2))
    world = (affine @ [ii[nearest], jj[nearest], k, 1])[:3].tolist()
    return tuple(page.evaluate(
        """w => { const v = window.cornerstone.getRenderingEngines()[0].getViewport('mpr-axial');
                  const r = v.element.getBoundingClientRect(); const c = v.worldToCanvas(w);
                  return [r.x + c[0], r.y + c[1]]; }""", world))
