"""What `rocm-zoo bench-load` asks of a server: the simulated users of each phase, their studies and clicks.

Plain data, no Locust: the parent process builds a `Phase` and writes it as JSON; the Locust child
(`python -m rocm_zoo.bench.load_locust`) reads it back. Load goes to loopback only (127.0.0.0/8, ::1, localhost),
with a bounded number of users for a bounded time: `check_loopback` and `Phase.check` refuse anything else, in the
parent and again in the child.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rocm_zoo.errors import RocmZooError
from rocm_zoo.registry import default_task

# The models each kind of user asks unless told another (the registry's first of each type).
DEEPEDIT_MODEL = default_task("deepedit")  # 3D Slicer's DeepEdit clicks
VISTA3D_MODEL = default_task("vista3d")  # OHIF's VISTA3D point prompts
AUTOMATIC_MODEL = default_task("segmentation", interactive=False)  # whole-study segmentations, back to back
MAX_USERS = 64  # simulated users of one phase, all classes together
MAX_DURATION_S = 4 * 3600.0  # one phase; a soak test runs 10-30 minutes

# User classes of the Locust child, by the key a Mix counts them under.
USER_CLASSES = {
    "deepedit": "DeepEditClinician",  # 3D Slicer DeepEdit clicks, think time between clicks
    "vista3d": "Vista3dClinician",  # OHIF VISTA3D point prompts, think time between clicks
    "automatic": "AutomaticRequester",  # automatic segmentation, back to back
    "bad": "BadRequester",  # requests the server must refuse with a 4xx (counted as intended)
    "hostile": "HostileRequester",  # attacks (archive slip, bombs, server paths, rebinding): each must be a 4xx
    "monitor": "Monitor",  # /info/ and /health/*, polled
    "batch": "BatchStarter",  # one batch over the datastore at the start, its progress polled
}


class LoadBenchError(RocmZooError, ValueError):
    """A load benchmark that cannot or must not run: a host off loopback, too many users, no study to click on."""


def check_loopback(url: str) -> str:
    """`url` without a trailing slash, if it is http(s) on a loopback host; LoadBenchError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LoadBenchError(f"{url!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000")
    host = parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower() == "localhost"
    if not loopback:
        raise LoadBenchError(f"bench-load sends load to loopback only (127.0.0.0/8, ::1 or localhost), not to "
                             f"{host!r}: run it on the server's machine against http://127.0.0.1:PORT")
    return url.rstrip("/")


@dataclass(frozen=True)
class Study:
    """One study a clinician works on: its datastore id and clicks inside the organ (voxel indices as stored, the
    organ's central voxel first)."""

    id: str
    clicks: tuple[tuple[int, int, int], ...]
    shape: tuple[int, int, int]


@dataclass(frozen=True)
class Mix:
    """How many users of each class run at once (a `USER_CLASSES` key each); `batch` names the model of a batch run
    over the datastore ("" for none)."""

    deepedit: int = 0
    vista3d: int = 0
    automatic: int = 0
    bad: int = 0
    hostile: int = 0
    monitor: int = 0
    batch: str = ""

    def counts(self) -> dict[str, int]:
        """User class name -> users, for the classes that run."""
        n = {k: getattr(self, k) for k in USER_CLASSES if k != "batch"}
        n["batch"] = 1 if self.batch else 0
        return {USER_CLASSES[k]: v for k, v in n.items() if v > 0}


@dataclass(frozen=True)
class Targets:
    """What the users ask, the same in every phase of a run."""

    url: str
    studies: tuple[Study, ...]  # clinicians take them in turn, one each while there are enough
    automatic_model: str = AUTOMATIC_MODEL
    automatic_images: tuple[str, ...] = ()  # AutomaticRequester cycles over these
    deepedit_model: str = DEEPEDIT_MODEL
    deepedit_label: str = "spleen"  # the label Slicer clicks for
    vista3d_model: str = VISTA3D_MODEL
    vista3d_class: int = 3  # the VISTA3D class id OHIF sends with the clicks (/info's labels[organ])
    think_time_s: float = 1.0
    monitor_interval_s: float = 1.0
    request_timeout_s: float = 300.0
    monitor_paths: tuple[str, ...] = ("/info/", "/health/live", "/health/ready")


@dataclass(frozen=True)
class Phase:
    name: str
    mix: Mix
    duration_s: float
    targets: Targets = field(repr=False, default=None)  # type: ignore[assignment]

    def check(self) -> "Phase":
        check_loopback(self.targets.url)
        users = sum(self.mix.counts().values())
        if not 0 < users <= MAX_USERS:
            raise LoadBenchError(f"phase '{self.name}': {users} users; bench-load runs 1 to {MAX_USERS} at once")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise LoadBenchError(f"phase '{self.name}': {self.duration_s} s; a phase runs more than 0 and at most "
                                 f"{MAX_DURATION_S:.0f} s")
        if (self.mix.deepedit or self.mix.vista3d) and not self.targets.studies:
            raise LoadBenchError("clinicians need a study with a click inside the spleen, and none was found")
        if self.mix.automatic and not self.targets.automatic_images:
            raise LoadBenchError("automatic requesters need at least one study")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Phase":
        d = json.loads(text)
        t = d["targets"]
        studies = tuple(Study(s["id"], tuple(tuple(c) for c in s["clicks"]), tuple(s["shape"])) for s in t["studies"])
        targets = Targets(**{**t, "studies": studies, "automatic_images": tuple(t["automatic_images"]),
                             "monitor_paths": tuple(t["monitor_paths"])})
        return cls(d["name"], Mix(**d["mix"]), d["duration_s"], targets).check()

    def write(self, path: Path) -> Path:
        path.write_text(self.to_json())
        return path


def phases(mix: Mix, targets: Targets, duration_s: float, baseline_s: float = 0.0) -> list[Phase]:
    """With `baseline_s`, first one user of each class of the mix alone (the baseline its ratios are against: batch
    and bad requests have none), then the mix."""
    out = []
    if baseline_s > 0:
        for key in ("deepedit", "vista3d", "automatic", "monitor"):
            if getattr(mix, key):
                out.append(Phase(f"{key} alone", Mix(**{key: 1}), baseline_s, targets))
    out.append(Phase("mixed", mix, duration_s, targets))
    return [p.check() for p in out]
