"""The Locust side of `rocm-zoo bench-load`: one phase of simulated users, headless, in a process of its own.

    python -m rocm_zoo.bench.load_locust PHASE_JSON SAMPLES_JSONL

Locust patches the standard library for gevent when it is imported, so only this process imports it (never the CLI,
the parent benchmark or pytest). It reads a `rocm_zoo.bench.load_plan.Phase`, runs its users with Locust's library
API (`Environment`, a local runner) for the phase's duration, lets requests in flight finish, and writes every
request as one JSON line: `t` (start, epoch s), `ms`, `user` (class), `name` (the series it counts under), `status`
(0: no answer), `expect` ("ok", "4xx": a refusal is intended, "ok_or_404": a route that may not exist) and `error`.
The parent classifies and summarises them (`rocm_zoo.bench.load_stats`).

Request formats are the viewers': 3D Slicer's DeepEdit click (`params` form field: one key per label with its
clicks, `result_extension`, `result_dtype`, `client_id`; MONAI Label's multipart answer), OHIF v3's VISTA3D point
prompt and automatic "Run" (`output=image`), as `rocm_zoo.server.tasks` read them.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import gevent
from locust import HttpUser, constant, task
from locust.env import Environment

from rocm_zoo.bench.load_plan import USER_CLASSES, Phase, Targets

MAX_CLICKS = 4  # a clinician adds clicks to a segment up to this many, then starts the next segment
HOSTILE_INFLATED_BYTES = 256 << 20  # what the stream bomb inflates to: well over any phantom's label, ~250 KB sent
BATCH_POLL_S = 2.0


def slicer_deepedit(label: str, clicks, client_id: str) -> dict:
    """What 3D Slicer's MONAI Label module sends for a DeepEdit click (its MONAILabel.py): the label's clicks."""
    return {"result_extension": ".nrrd", "result_dtype": "uint8", "client_id": client_id, "label": label,
            label: [list(c) for c in clicks], "background": []}


def ohif_vista3d(class_id: int, clicks) -> dict:
    """What OHIF v3's MONAI Label panel sends for VISTA3D point prompts on one class."""
    return {"result_extension": ".nrrd", "result_dtype": "uint8", "points": [list(c) for c in clicks],
            "point_labels": [1] * len(clicks), "label_prompt": [class_id]}


class ZooUser(HttpUser):
    abstract = True
    targets: Targets  # set by `user_classes`
    _study_turn = itertools.count()  # clinicians of every class take the studies in turn

    def request_as(self, method: str, path: str, series: str, expect: str = "ok", **kwargs):
        return self.client.request(method, path, name=series, timeout=self.targets.request_timeout_s,
                                   context={"user": type(self).__name__, "expect": expect}, **kwargs)

    def infer(self, model: str, image: str, params: dict, series: str, expect: str = "ok", output: str = ""):
        query = {"image": image, **({"output": output} if output else {})}
        return self.request_as("POST", f"/infer/{model}", series, expect, params=query,
                               files={"params": (None, json.dumps(params))})


class Clinician(ZooUser):
    """Works on one study: adds clicks inside the organ, one request per click, thinking between them."""

    abstract = True

    def on_start(self) -> None:
        studies = self.targets.studies
        turn = next(ZooUser._study_turn)
        self.study = studies[turn % len(studies)]
        self.client_id = f"bench-load-{type(self).__name__}-{turn}"
        self.clicks = 0

    def next_clicks(self) -> tuple:
        self.clicks = self.clicks % min(MAX_CLICKS, len(self.study.clicks)) + 1
        return self.study.clicks[:self.clicks]


class DeepEditClinician(Clinician):
    @task
    def click(self) -> None:
        t = self.targets
        self.infer(t.deepedit_model, self.study.id, slicer_deepedit(t.deepedit_label, self.next_clicks(),
                                                                    self.client_id), "deepedit click")


class Vista3dClinician(Clinician):
    @task
    def click(self) -> None:
        t = self.targets
        self.infer(t.vista3d_model, self.study.id, ohif_vista3d(t.vista3d_class, self.next_clicks()),
                   "vista3d click", output="image")


class AutomaticRequester(ZooUser):
    """Asks for the automatic model's segmentation of the next study as soon as the last one came back."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.images = itertools.cycle(self.targets.automatic_images)

    @task
    def segment(self) -> None:
        t = self.targets
        self.infer(t.automatic_model, next(self.images), {"result_extension": ".nrrd", "result_dtype": "uint8"},
                   f"automatic {t.automatic_model}", output="image")


class BadRequester(ZooUser):
    """Requests the server must refuse with a 4xx and go on serving, in turn: an unknown model, a click outside the
    image (where there is a study with clicks)."""

    def on_start(self) -> None:
        self.turn = itertools.count()

    @task
    def bad_request(self) -> None:
        t = self.targets
        if next(self.turn) % 2 == 0 or not t.studies:
            self.infer("no_such_model", t.automatic_images[0], {}, "bad: unknown model", expect="4xx", output="image")
            return
        outside = [[s + 10 for s in t.studies[0].shape]]
        self.infer(t.deepedit_model, t.studies[0].id, slicer_deepedit(t.deepedit_label, outside, "bench-load-bad"),
                   "bad: click outside", expect="4xx")


class HostileRequester(ZooUser):
    """What an attacker or a broken client sends, in turn; each must be refused with a 4xx and leave nothing behind
    (`rocm_zoo.bench.hostile` builds the payloads): a session archive whose member climbs out of its folder, a label
    whose header announces a volume far over the budget, a label with the image's header whose gzip stream goes on
    inflating, a server path as the image, MONAI Label's WSI route asked about a server file, and a page of another
    site reaching the server by DNS rebinding (its `Host` header)."""

    def on_start(self) -> None:
        from rocm_zoo.bench import hostile

        self.turn = itertools.count()
        study = self.targets.studies[0] if self.targets.studies else None
        self.image = study.id if study else self.targets.automatic_images[0]
        shape = study.shape if study else (64, 64, 32)
        self.payloads = {
            "slip": hostile.slip_tar(),
            "header bomb": hostile.bomb_nifti_gz((4096, 4096, 4096), 1 << 20),
            "stream bomb": hostile.bomb_nifti_gz(tuple(shape), HOSTILE_INFLATED_BYTES),
        }

    @task
    def attack(self) -> None:
        t = self.targets
        kind = next(self.turn) % 6
        if kind == 0:
            self.request_as("PUT", "/session/", "hostile: archive slip", expect="4xx", params={"uncompress": "true"},
                            files={"files": ("session.tar", self.payloads["slip"])})
        elif kind in (1, 2):
            name = "header bomb" if kind == 1 else "stream bomb"
            self.request_as("PUT", "/datastore/label", f"hostile: label {name}", expect="4xx",
                            params={"image": self.image, "tag": "hostile"},
                            files={"label": ("label.nii.gz", self.payloads[name])})
        elif kind == 3:
            self.infer(t.automatic_model, "/etc/passwd", {}, "hostile: server path", expect="4xx", output="json")
        elif kind == 4:
            self.request_as("POST", "/infer/wsi_v2/x", "hostile: wsi oracle", expect="4xx",
                            params={"image": "/etc/passwd"})
        else:
            self.request_as("GET", "/datastore/", "hostile: rebinding Host", expect="4xx",
                            headers={"Host": "rebind.example"})


class Monitor(ZooUser):
    """Polls /info/ and the health routes, as a load balancer or a dashboard does. A health route that does not exist
    (404) counts as not available, not as an error."""

    @task
    def poll(self) -> None:
        for path in self.targets.monitor_paths:
            self.request_as("GET", path, f"GET {path}", expect="ok" if path.startswith("/info") else "ok_or_404")


class BatchStarter(ZooUser):
    """Starts one batch over the datastore (`POST /batch/infer/<model>?images=all`), polls its progress, and stops it
    when the phase ends, so the load stops by itself."""

    model = ""  # set by `user_classes`

    def on_start(self) -> None:
        self.request_as("POST", f"/batch/infer/{self.model}", "batch start", params={"images": "all"}, json={})
        self.progress: dict = {}

    @task
    def poll(self) -> None:
        r = self.request_as("GET", "/batch/infer", "batch status")
        if r.status_code == 200 and r.content:
            self.progress = r.json()

    def on_stop(self) -> None:
        if self.progress.get("state", "running") == "running":
            self.request_as("DELETE", "/batch/infer", "batch stop")


CLASSES = {c.__name__: c for c in (DeepEditClinician, Vista3dClinician, AutomaticRequester, BadRequester,
                                   HostileRequester, Monitor, BatchStarter)}
assert set(CLASSES) == set(USER_CLASSES.values())


def user_classes(phase: Phase) -> list[type[ZooUser]]:
    """Subclasses of the phase's user classes with its targets, counts and waits."""
    t = phase.targets
    waits = {"DeepEditClinician": t.think_time_s, "Vista3dClinician": t.think_time_s, "BadRequester": t.think_time_s,
             "HostileRequester": t.think_time_s, "Monitor": t.monitor_interval_s, "BatchStarter": BATCH_POLL_S}
    out = []
    for name, count in phase.mix.counts().items():
        attrs = {"targets": t, "fixed_count": count, "host": t.url}
        if name in waits:
            attrs["wait_time"] = constant(waits[name])
        if name == "BatchStarter":
            attrs["model"] = phase.mix.batch
        out.append(type(name, (CLASSES[name],), attrs))
    return out


def _quit_at(runner, deadline: float) -> None:
    # by the wall clock: gevent's timers count from the loop's cached time, which can be seconds old here
    while (left := deadline - time.time()) > 0:
        gevent.sleep(min(left, 0.5))
    runner.quit()


def run(phase: Phase, samples_path: Path) -> dict:
    """Runs the phase, writing its requests to `samples_path`; returns its start and end (epoch s) and request
    count, which `main` writes next to the samples (`<samples>.phase.json`)."""
    classes = user_classes(phase)
    env = Environment(user_classes=classes, stop_timeout=phase.targets.request_timeout_s)
    written = 0
    with open(samples_path, "w") as out:
        def on_request(request_type, name, response_time, response_length, response=None, context=None,
                       exception=None, start_time=None, **_kw) -> None:
            nonlocal written
            context = context or {}
            status = int(getattr(response, "status_code", 0) or 0)
            error = None if exception is None else f"{type(exception).__name__}: {exception}"[:300]
            out.write(json.dumps({"t": start_time, "ms": round(response_time, 3), "user": context.get("user"),
                                  "name": name, "status": status, "expect": context.get("expect", "ok"),
                                  "error": error}) + "\n")
            written += 1

        env.events.request.add_listener(on_request)
        runner = env.create_local_runner()
        users = sum(c.fixed_count for c in classes)
        start = time.time()
        runner.start(users, spawn_rate=max(users, 1) * 10)
        gevent.spawn(_quit_at, runner, start + phase.duration_s)
        runner.greenlet.join()
    end = time.time()
    print(f"phase '{phase.name}': {written} requests in {end - start:.1f} s", flush=True)
    return {"start": start, "end": end, "requests": written}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    phase = Phase.from_json(Path(argv[0]).read_text())
    samples = Path(argv[1])
    meta = run(phase, samples)
    samples.with_suffix(".phase.json").write_text(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
