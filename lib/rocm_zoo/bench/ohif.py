"""`rocm-zoo bench-ohif`: "Run" in OHIF's MONAI Label panel to the segmentation shown, against a real PACS.

The spleen_10-shaped phantom (512x512x55) is written as a CT DICOM series and stored in a local Orthanc; for each
model a fresh rocm_zoo server is started against it (with a new DICOMweb cache, so the first Run fetches and converts
the series), waited on until every model is warm, and OHIF is opened in headless Chromium exactly as the browser test
does (rocm_zoo.bench.ohif_driver). Timed: click on Run -> the panel's success notification (the mask is in the viewer
then), first and `repeats` more; each with the server's own stage split of that request (fetch series, convert, infer
with MONAI Label's pre/infer/post/write, encode SEG, store), read from the server's log line (rocm_zoo.server.http.request_stages).

OHIF's Run does not ask the server to save the label (its panel sends no `save_label`), so encode SEG and store are 0
there. The store-back is timed right after, through the REST API with the very params the panel sent plus
`save_label` (what a batch run or a saved label does): that is where the SEG stages are measured.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from rocm_zoo.app.app_folder import make_app_folder
from rocm_zoo.bench import ohif_driver as ohif
from rocm_zoo.bench import pacs
from rocm_zoo.bench.server_process import free_port, monailabel_server, wait_warm
from rocm_zoo.bench.stats import medians
from rocm_zoo.registry import TASKS, default_task, ohif_actions
from rocm_zoo.samples import phantom
from rocm_zoo.samples.dicom_series import series_uids
from rocm_zoo.samples.write import write_bundles, write_dicom_studies
from rocm_zoo.server.http import request_stages

logger = logging.getLogger(__name__)
BUTTONS = {"auto": ohif.AUTO, "point": ohif.POINT}  # the panel's Run button per registry OHIF tab
DEFAULT_MODELS = (default_task("segmentation", interactive=False), default_task("vista3d"))  # one per OHIF tab


def actions() -> dict[str, tuple[str, str]]:
    """How OHIF asks each model meant for it (from the registry): model -> (Run button, notification when shown)."""
    return {name: BUTTONS[tab] for name, tab in ohif_actions().items()}
SERVER_START_S = 1800  # a cold compile of the tiny networks on 2 CPU cores takes minutes
STAGE_LINE_WAIT_S = 30.0


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "device": "cpu", "platform": platform.platform()}


def _first_line(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def versions() -> dict[str, Any]:
    import monailabel
    from importlib.metadata import version

    from rocm_zoo.bench.network import versions as engine_versions

    return {**engine_versions("cpu"), "monailabel": monailabel.__version__, "playwright": version("playwright"),
            "orthanc": _first_line([pacs.check_installed(), "--version"]),
            "chromium": _first_line([ohif.CHROMIUM, "--version"])}


def stage_lines(log: Path) -> list[dict]:
    return [s for s in map(request_stages.parse_line, log.read_text(errors="replace").splitlines()) if s]


def next_stages(log: Path, seen: int, model: str) -> dict:
    """The stage line the server logged for the request after the first `seen` ones."""
    deadline = time.time() + STAGE_LINE_WAIT_S
    while time.time() < deadline:
        new = [s for s in stage_lines(log)[seen:] if s["model"] == model]
        if new:
            return new[-1]
        time.sleep(0.2)
    raise TimeoutError(f"no '{request_stages.LOG_PREFIX}' line for {model} in {log}")


def rest_infer(url: str, model: str, image: str, params: dict) -> dict:
    """One request as the panel sends it, through MONAI Label's REST API, `output=json`; returns its stages."""
    r = requests.post(f"{url}/infer/{model}", params={"image": image, "output": "json"},
                      files={"params": (None, json.dumps(params))}, timeout=900)
    r.raise_for_status()
    latencies = r.json()["latencies"]
    return {**latencies["stages"], "task": {k: latencies[k] for k in request_stages.TASK_LATENCIES if k in latencies}}


def _p50(rows: list[dict], key: str) -> float:
    return medians(rows, [key], digits=3)[key]


def _stage_p50(stages: list[dict]) -> dict[str, float]:
    out = medians(stages, request_stages.STAGES + ("request",), digits=3)
    task = medians([s.get("task", {}) for s in stages], request_stages.TASK_LATENCIES, digits=3)
    return {**out, **{f"task_{k}": v for k, v in task.items()}}


def run_scenario(model: str, app_dir: Path, work: Path, dicomweb_url: str, spec: phantom.PhantomSpec,
                 study: str, series: str, repeats: int) -> dict[str, Any]:
    action = actions()[model]
    log = work / f"server-{model}.log"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
           "MONAI_LABEL_DICOMWEB_CACHE_PATH": str(work / f"dicom-cache-{model}")}  # new: the first Run fetches
    shutil.rmtree(env["MONAI_LABEL_DICOMWEB_CACHE_PATH"], ignore_errors=True)
    start = time.perf_counter()
    with monailabel_server(app_dir, dicomweb_url, TASKS[model].model, log, cwd=work, timeout_s=SERVER_START_S,
                           env=env) as url:
        warm = wait_warm(url, SERVER_START_S)
        server_ready_s = time.perf_counter() - start
        logger.info("%s: server warm after %.0f s", model, server_ready_s)
        with ohif.browser_page(url) as page:
            blank = ohif.open_study(page, url, study, spec.name)
            ohif.connect_panel(page)
            sent = ohif.record_infer_requests(page)
            if action == ohif.AUTO:
                ohif.select_auto_model(page, model)
            else:
                ohif.place_point(page, "spleen", spec)
                blank = ohif.axial_pixels(page)
            runs = []
            for i in range(1 + repeats):
                seen = len(stage_lines(log))
                seconds = ohif.run_and_wait(page, action)
                stages = next_stages(log, seen, model)
                drawn = ohif.changed(blank, ohif.axial_pixels(page))
                if drawn <= ohif.MIN_CHANGED_PIXELS:  # kept in the record; an untrained sample may segment little
                    logger.warning("%s run %d: only %d viewer pixels changed", model, i + 1, drawn)
                runs.append({"run_to_shown_s": round(seconds, 3), "changed_pixels": drawn, "server": stages})
                logger.info("%s run %d: %.2f s Run -> shown (server %.2f s)", model, i + 1, seconds,
                            stages["request"])
                ohif.wait_notification_gone(page, action)
        if not sent:
            raise RuntimeError(f"{model}: the panel sent no /infer/ request")
        params = {**sent[-1][1], "save_label": True, "label_tag": "original"}
        store_back = [rest_infer(url, model, series, params) for _ in range(repeats)]
    repeated = runs[1:]
    return {
        "model": model, "ohif_action": action[0], "server_ready_s": round(server_ready_s, 1), "warm": warm,
        "panel_params": sent[-1][1],
        "first": runs[0],
        "repeated": repeated,
        "repeated_p50": {"run_to_shown_s": _p50(repeated, "run_to_shown_s"),
                         **_stage_p50([r["server"] for r in repeated])},
        "store_back": {"what": "the panel's request with save_label, through the REST API (output=json)",
                       "runs": store_back, "p50": _stage_p50(store_back)},
    }


def run_ohif_bench(out_dir: Path, repeats: int = 5, models: tuple[str, ...] = DEFAULT_MODELS,
                   work_dir: Path | None = None, command: str = "") -> dict[str, Any]:
    unknown = [m for m in models if m not in actions()]
    if unknown:
        raise ValueError(f"bench-ohif times {sorted(actions())}; not {unknown}")
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = phantom.SPLEEN10
    record: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "machine": machine(), "versions": versions(), "bundles": "tiny sample bundles (rocm-zoo sample), CPU",
        "phantom": {"name": spec.name, "shape": list(spec.shape), "spacing_mm": list(spec.spacing)},
        "repeats": repeats, "what": __doc__.split("\n\n")[0], "scenarios": [],
    }
    with tempfile.TemporaryDirectory(prefix="rocm_zoo_bench_ohif_") as tmp:
        work = Path(work_dir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        app_dir = work / "app"
        if not app_dir.exists():
            make_app_folder(app_dir)
            write_bundles(app_dir / "model", "tiny")
        (series_dir,) = write_dicom_studies(work / "dicom", [spec])
        study, series = series_uids(phantom.make_phantom(spec))
        config = pacs.PacsConfig(folder=work / f"orthanc-{os.getpid()}", http_port=free_port())
        orthanc = pacs.start(config)
        try:
            pacs.upload(config, sorted(series_dir.glob("*.dcm")))
            for model in models:
                record["scenarios"].append(run_scenario(model, app_dir, work, config.dicomweb_url, spec, study,
                                                        series, repeats))
                (out_dir / "bench_ohif.json").write_text(json.dumps(record, indent=2))  # partial results survive
        finally:
            pacs.stop(orthanc)
    (out_dir / "bench_ohif.json").write_text(json.dumps(record, indent=2))
    (out_dir / "bench_ohif.md").write_text(markdown(record))
    print(markdown(record))
    return record


def _stage_cells(s: dict) -> str:
    task = s.get("task") or {k[5:]: v for k, v in s.items() if k.startswith("task_")}
    split = "/".join(f"{task.get(k, 0):.2f}" for k in ("pre", "infer", "post", "write")) if task else "-"
    return (f"{s['request']:.2f} | {s['fetch_series']:.2f} | {s['convert']:.2f} | {s['infer']:.2f} | {split} "
            f"| {s['encode_seg']:.2f} | {s['store']:.2f}")


def markdown(record: dict) -> str:
    v, m = record["versions"], record["machine"]
    lines = [f"{record['date']}; {m['cpu']}, {m['cores']} cores (CPU); torch {v['torch']}; MONAI {v['monai']}; "
             f"MONAI Label {v['monailabel']}; {v['orthanc']}; {v['chromium']}; {record['bundles']}; phantom "
             f"{record['phantom']['name']} {'x'.join(map(str, record['phantom']['shape']))}; first run on a fresh "
             f"server, then p50 of {record['repeats']}", "",
             "| model | OHIF action | run | Run -> shown s | server request s | fetch series s | convert s | infer s "
             "| task pre/infer/post/write s | encode SEG s | store s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for sc in record["scenarios"]:
        first, rep = sc["first"], sc["repeated_p50"]
        lines.append(f"| {sc['model']} | {sc['ohif_action']} | first (series not cached) | "
                     f"{first['run_to_shown_s']:.2f} | {_stage_cells(first['server'])} |")
        lines.append(f"| {sc['model']} | {sc['ohif_action']} | repeated (p50 of {len(sc['repeated'])}) | "
                     f"{rep['run_to_shown_s']:.2f} | {_stage_cells(rep)} |")
        sb = sc["store_back"]["p50"]
        lines.append(f"| {sc['model']} | same request + save_label (REST) | p50 of {len(sc['store_back']['runs'])} "
                     f"| - | {_stage_cells(sb)} |")
    return "\n".join(lines) + "\n"
