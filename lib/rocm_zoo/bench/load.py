"""`rocm-zoo bench-load`: simulated clinicians and automatic clients against one server, on Locust.

N DeepEdit clinicians (3D Slicer clicks) and N VISTA3D clinicians (OHIF point prompts), each on a study of its own
with a think time between clicks; M automatic requesters asking a segmentation back to back; optionally requests
the server must refuse, a batch run over the datastore, and a monitor polling /info/ and /health/*. With a baseline,
one user of each class first runs alone, and the mix's latencies and throughput are given as ratios against that
(speed claims are ratios against a baseline of the same run). Per series: p50/p90/p99, throughput, outcomes; the
server's RSS and GPU memory sampled throughout; a JSON record, markdown made from it, and a plot of latency over
time. Locust runs each phase in a process of its own (`rocm_zoo.bench.load_locust`), so nothing here imports it.

Load goes to loopback only, from a bounded number of users for a bounded time, and stops by itself.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import requests

from rocm_zoo.bench import load_report, load_stats
from rocm_zoo.bench.load_plan import (AUTOMATIC_MODEL, DEEPEDIT_MODEL, VISTA3D_MODEL, LoadBenchError, Mix, Phase, Study,
                                      Targets, check_loopback, phases)
from rocm_zoo.bench.server_process import monailabel_server_process, wait_warm
from rocm_zoo.bench.server_resources import RESOURCES, ResourceSampler, growth, listening_pid
from rocm_zoo.registry import TASKS

logger = logging.getLogger(__name__)
SERVER_START_S = 1800.0  # a cold compile of every tiny network on 2 CPU cores takes minutes
CLICKS_PER_STUDY = 4
ORGAN = "spleen"
CHILD_GRACE_S = 120.0  # beyond the phase and its requests in flight, before the Locust process is stopped


def organ_clicks(truth: np.ndarray, label: int, count: int = CLICKS_PER_STUDY, seed: int = 0) -> list[list[int]]:
    """Voxels inside the organ, as an annotator clicks: its central voxel, then seeded ones from its inner half
    (nearest the centroid)."""
    from rocm_zoo.engine.masks import central_voxel

    mask = truth == label
    if not mask.any():
        return []
    pts = np.argwhere(mask)
    d = ((pts - pts.mean(0)) ** 2).sum(1)
    inner = pts[d <= np.median(d)]
    rng = np.random.default_rng(seed)
    more = inner[rng.choice(len(inner), size=min(count - 1, len(inner)), replace=False)]
    return [central_voxel(mask), *[p.tolist() for p in more]]


def studies_with_clicks(image_ids: list[str], truth_dir: Path) -> list[Study]:
    """The studies whose truth mask (`<truth_dir>/<id>.nii.gz`, as `rocm-zoo sample` writes it) has the organ."""
    import nibabel as nib

    from rocm_zoo.samples.phantom import ORGAN_LABELS

    out = []
    for i, image_id in enumerate(image_ids):
        path = Path(truth_dir) / f"{image_id}.nii.gz"
        if not path.exists():
            continue
        truth = np.asarray(nib.load(str(path)).dataobj)
        clicks = organ_clicks(truth, ORGAN_LABELS[ORGAN], seed=i)
        if clicks:
            out.append(Study(image_id, tuple(tuple(c) for c in clicks), tuple(int(s) for s in truth.shape[:3])))
    return out


def make_targets(url: str, truth_dir: Path, images: list[str] | None, automatic_model: str,
                 automatic_images: list[str] | None, mix: Mix, think_time_s: float,
                 request_timeout_s: float) -> tuple[Targets, dict]:
    """What the users ask, from the server's datastore and /info (the models must be there), and that /info."""
    info = requests.get(f"{url}/info/", timeout=30).json()
    models = info.get("models", {})
    wanted = {"deepedit": DEEPEDIT_MODEL, "vista3d": VISTA3D_MODEL, "automatic": automatic_model, "bad": None,
              "hostile": automatic_model, "monitor": None, "batch": mix.batch or None}
    for key, model in wanted.items():
        if model and getattr(mix, key) and model not in models:
            raise LoadBenchError(f"the server has no model '{model}' (for --{key}); it serves: {', '.join(models)}")
    listed = sorted(requests.get(f"{url}/datastore/?output=all", timeout=30).json().get("objects", {}))
    if not listed:
        raise LoadBenchError(f"the server's datastore ({url}/datastore/) has no study")
    chosen = images or listed
    unknown = sorted(set(chosen) - set(listed)) + sorted(set(automatic_images or ()) - set(listed))
    if unknown:
        raise LoadBenchError(f"not in the server's datastore: {', '.join(unknown)}; it has: {', '.join(listed)}")
    studies = studies_with_clicks(chosen, truth_dir) if (mix.deepedit or mix.vista3d or mix.bad or mix.hostile) else []
    if (mix.deepedit or mix.vista3d) and not studies:
        raise LoadBenchError(f"clinicians click inside the {ORGAN}, found from a truth mask <id>.nii.gz in "
                             f"{truth_dir}; none there for {', '.join(chosen)} (give --truth DIR; `rocm-zoo sample` "
                             "writes the phantoms' masks)")
    vista_labels = models.get(VISTA3D_MODEL, {}).get("labels", {})
    targets = Targets(url=url, studies=tuple(studies), automatic_model=automatic_model,
                      automatic_images=tuple(automatic_images or chosen[:1]), deepedit_label=ORGAN,
                      vista3d_class=int(vista_labels.get(ORGAN, 3)), think_time_s=think_time_s,
                      request_timeout_s=request_timeout_s)
    return targets, info


def run_phase(phase: Phase, out_dir: Path, sampler: ResourceSampler | None) -> tuple[list[dict], float]:
    """The phase's users in a Locust process of their own; its requests (each tagged with the phase) and start."""
    slug = phase.name.replace(" ", "-")
    plan = phase.write(out_dir / f"phase-{slug}.json")
    samples_path = out_dir / f"samples-{slug}.jsonl"
    if sampler:
        sampler.phase = phase.name
    with open(out_dir / f"locust-{slug}.log", "w") as log:
        child = subprocess.Popen([sys.executable, "-m", "rocm_zoo.bench.load_locust", str(plan), str(samples_path)],
                                 stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            rc = child.wait(timeout=phase.duration_s + phase.targets.request_timeout_s + CHILD_GRACE_S)
        except subprocess.TimeoutExpired:
            raise LoadBenchError(f"phase '{phase.name}': the Locust process did not stop; see {log.name}") from None
        finally:  # also on Ctrl-C or SIGTERM: no load outlives the benchmark
            if child.poll() is None:
                child.kill()
                child.wait()
    if rc != 0:
        tail = (out_dir / f"locust-{slug}.log").read_text()[-3000:]
        raise LoadBenchError(f"phase '{phase.name}': the Locust process exited with {rc}:\n{tail}")
    samples = [{**s, "phase": phase.name} for s in load_stats.read_samples(samples_path)]
    meta = samples_path.with_suffix(".phase.json")
    start = json.loads(meta.read_text())["start"]  # when the users started, once Locust was imported
    for path in (samples_path, meta, plan):
        path.unlink()
    return samples, start


@contextlib.contextmanager
def _server(url: str | None, app: Path, studies: Path, models: str, device: str, conf: dict[str, str],
            out_dir: Path) -> Iterator[tuple[str, int | None, Path | None]]:
    """(URL, server pid or None, its temporary folder if bench-load started it): the given server, or one started
    here, with a temporary folder of its own (TMPDIR) so that what requests leave there is seen."""
    if url:
        url = check_loopback(url)
        # A model compiling in the background holds up every request: time the warm server, as a started one.
        wait_warm(url, SERVER_START_S)
        yield url, listening_pid(url), None
        return
    from rocm_zoo.app.app_folder import make_app_folder

    if not (app / "model").is_dir():
        raise LoadBenchError(f"no bundles in {app / 'model'}: give --app DIR, or write the samples first "
                             "(`rocm-zoo sample`), or give --url of a running server")
    make_app_folder(app)  # its main.py, if missing (as `rocm-zoo serve` does)
    server_conf = {"device": device, **conf}
    temp_dir = out_dir / "server-tmp"
    temp_dir.mkdir(exist_ok=True)
    with monailabel_server_process(app, str(studies), models, out_dir / "server.log", cwd=out_dir,
                                   timeout_s=SERVER_START_S, env={"TMPDIR": str(temp_dir)},
                                   conf=server_conf) as (started, proc):
        wait_warm(started, SERVER_START_S)
        yield started, proc.pid, temp_dir


def server_models(mix: Mix, automatic_model: str) -> str:
    """The `--conf models` list a server started here needs for the mix."""
    names = [DEEPEDIT_MODEL] * bool(mix.deepedit or mix.bad) + [VISTA3D_MODEL] * bool(mix.vista3d)
    names += [automatic_model] * bool(mix.automatic or mix.hostile) + [mix.batch] * bool(mix.batch)
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise LoadBenchError(f"unknown model {', '.join(unknown)}; known: {', '.join(TASKS)}")
    return ",".join(dict.fromkeys(TASKS[n].model for n in names))


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def batch_outcome(url: str, model: str, timeout_s: float) -> dict | None:
    """The last batch of `model` once it is no longer running (the phase's end asked it to stop after its current
    study), without its per-study times; None if the server shows none."""
    deadline = time.time() + timeout_s
    while True:
        try:
            runs = requests.get(f"{url}/batch/infer", params={"all": "true"}, timeout=30).json()
        except (requests.RequestException, ValueError):
            return None
        mine = [r for r in runs if r.get("model") == model] if isinstance(runs, list) else []
        if not mine:
            return None
        if mine[-1].get("state") != "running" or time.time() > deadline:
            return {k: v for k, v in mine[-1].items() if k != "seconds_per_study"}
        time.sleep(1)


def run_load_bench(*, out_dir: Path, url: str | None = None, app: Path = Path("apps/rocm_zoo"),
                   studies: Path = Path("sample-data/studies"), truth: Path = Path("sample-data/truth"),
                   device: str = "auto", conf: dict[str, str] | None = None, deepedit: int = 2, vista3d: int = 1,
                   automatic: int = 1, automatic_model: str = AUTOMATIC_MODEL,
                   automatic_images: list[str] | None = None, bad: int = 0, hostile: int = 0, monitor: bool = True,
                   batch: str = "", images: list[str] | None = None,
                   think_time_s: float = 1.0, duration_s: float = 60.0, baseline_s: float = 0.0,
                   request_timeout_s: float = 300.0, command: str = "") -> dict[str, Any]:
    mix = Mix(deepedit=deepedit, vista3d=vista3d, automatic=automatic, bad=bad, hostile=hostile,
              monitor=int(monitor), batch=batch)
    if importlib.util.find_spec("locust") is None:  # looked up, not imported: only the child process imports it
        raise LoadBenchError("Locust is not installed here: pip install 'rocm-zoo[bench]'")
    if url:
        check_loopback(url)
    models = server_models(mix, automatic_model)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "what": __doc__.split("\n\n")[1].replace("\n", " "), "think_time_s": think_time_s, "duration_s": duration_s,
        "baseline_s": baseline_s, "mix": mix.__dict__,
        "versions": {"locust": _version("locust"), "monailabel": _version("monailabel"),
                     "python": platform.python_version()},
        "samples_file": "samples.jsonl", "phases": {},
    }
    with _server(url, Path(app).resolve(), Path(studies).resolve(), models, device, conf or {}, out_dir) as (
            base, pid, temp_dir):
        targets, info = make_targets(base, Path(truth), images, automatic_model, automatic_images, mix, think_time_s,
                                     request_timeout_s)
        record["server"] = {"url": base, "started_by_bench_load": temp_dir is not None, "pid": pid,
                            "backend": info.get("rocm_zoo", {}).get("backend"),
                            "warm": info.get("rocm_zoo", {}).get("warm")}
        record["studies"] = [s.id for s in targets.studies]
        sampler = ResourceSampler(pid, temp_dir=temp_dir).start() if pid else None
        all_samples: list[dict] = []
        try:
            for phase in phases(mix, targets, duration_s, baseline_s):
                logger.info("bench-load: phase '%s' (%s) for %g s", phase.name, phase.mix, phase.duration_s)
                samples, start = run_phase(phase, out_dir, sampler)
                all_samples += samples
                summary = load_stats.summarise_phase(samples, start, phase.duration_s)
                entry = {"mix": phase.mix.__dict__, "duration_s": phase.duration_s, "start": start, **summary}
                if phase.mix.batch:
                    entry["batch"] = batch_outcome(base, phase.mix.batch, request_timeout_s)
                record["phases"][phase.name] = entry
        finally:
            if sampler:
                sampler.stop()
    record["start"] = min(p["start"] for p in record["phases"].values())
    if len(record["phases"]) > 1:
        record["ratios"] = load_stats.ratios(record["phases"])
    rows = sampler.rows if sampler else []
    record["resources"] = {"samples": rows, **{k: growth(rows, k) for k in RESOURCES}}
    if not sampler:
        record["resources"]["note"] = "not sampled: the process serving the URL cannot be seen from here"
    elif sampler.error:
        record["resources"]["note"] = f"sampling stopped: {sampler.error}"
    record["targets"] = load_stats.check_targets(record)
    with open(out_dir / "samples.jsonl", "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in all_samples)
    (out_dir / "load.json").write_text(json.dumps(record, indent=1))
    (out_dir / "load.md").write_text(load_report.markdown(record))
    load_report.plot(record, out_dir / "load.png")
    return record
