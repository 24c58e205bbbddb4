"""A server several people share (issue: clicks stay instant while others click and whole-body CT runs).

A server of its own, so the timings are not disturbed by other tests: DeepEdit for the clicks, wholeBody_ct as the long
automatic work, compiled from a cold cache so its background compile is still running when the server is ready. Its
queue of automatic requests holds one and its deadline is short, so the 503 and 504 paths are reachable; the long work
is a wide field of view (hundreds of window batches on the tiny bundle).
"""

from __future__ import annotations

import json
import shutil
import statistics
import threading
import time

import pytest
import requests

from rocm_zoo.engine.masks import central_voxel
from rocm_zoo.samples import phantom
from zoo_test_support import monailabel_server

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_S = 20
IDLE_S = 4.0  # how long the batch's own pace is measured while nobody clicks
# A field of view of 84 x 84 x 69 cm: the tiny wholeBody_ct (4 mm, 48^3 windows) needs well over the deadline on a CPU
# (60 x 60 x 45 cm took 12.6 s once served networks stopped requiring grad).
WIDE = phantom.PhantomSpec("wide_fov", (280, 280, 230), (3.0, 3.0, 3.0), seed=4_242)
STUDIES = ("phantom_test0", "phantom_test1")


@pytest.fixture(scope="module")
def shared(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    studies = root / "studies"
    studies.mkdir()
    for image_id in STUDIES:
        shutil.copy(sample_env.image_path(image_id), studies)
    phantom.write_phantom(phantom.make_phantom(WIDE), studies / f"{WIDE.name}.nii.gz", root / "wide_truth.nii.gz")
    conf = {"max_queued_requests": "1", "request_timeout_s": str(REQUEST_TIMEOUT_S)}
    with monailabel_server(sample_env.app_dir, str(studies), "spleen_deepedit,wholeBody_ct", root / "server.log",
                           cwd=root, timeout_s=900, env={"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")},
                           conf=conf) as url:
        yield url, root


def click(url: str, image_id: str, sample_env, client: str) -> float:
    """One Slicer DeepEdit click in the spleen; its wall time through HTTP."""
    spot = central_voxel(sample_env.truth(image_id) == 1)
    params = {"result_extension": ".nrrd", "result_dtype": "uint8", "client_id": client, "label": "spleen",
              "spleen": [spot], "background": []}
    start = time.perf_counter()
    r = requests.post(f"{url}/infer/spleen_deepedit", params={"image": image_id},
                      files={"params": (None, json.dumps(params))}, timeout=120)
    assert r.status_code == 200, r.text
    return time.perf_counter() - start


def warm_state(url: str, model: str) -> str:
    return requests.get(f"{url}/health/ready", timeout=5).json()["models"][model]


def sharing(url: str) -> dict:
    return requests.get(f"{url}/info/", timeout=5).json()["rocm_zoo"]["requests"]


def heap(url: str) -> dict:
    return requests.get(f"{url}/info/", timeout=5).json()["rocm_zoo"]["heap"]


def automatic(url: str, image_id: str, out: dict, key: str, timeout: float = 120) -> None:
    """A wholeBody_ct request in a thread; its status (or the client's error) and time land in `out[key]`."""
    def run():
        start = time.perf_counter()
        try:
            r = requests.post(f"{url}/infer/wholeBody_ct", params={"image": image_id},
                              files={"params": (None, json.dumps({"result_extension": ".nrrd"}))}, timeout=timeout)
            out[key] = (r.status_code, r.headers, r.text, time.perf_counter() - start)
        except requests.RequestException as e:
            out[key] = (type(e).__name__, {}, str(e), time.perf_counter() - start)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def wait_for(condition, what: str, timeout_s: float = 60.0, every_s: float = 0.2):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"not within {timeout_s} s: {what}")


def test_ready_means_the_interactive_models_are_warm_and_says_what_still_warms(shared):
    url, _ = shared
    ready = requests.get(f"{url}/health/ready", timeout=5)
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.json()["models"]["spleen_deepedit"].startswith("warm (")
    assert requests.get(f"{url}/health/live", timeout=5).json() == {"status": "live"}


def test_a_click_during_a_background_compile_is_not_delayed_by_it(shared, sample_env):
    url, _ = shared
    during = []
    while warm_state(url, "wholeBody_ct").split()[0] in ("pending", "warming") and len(during) < 5:
        during.append(click(url, STUDIES[0], sample_env, "alice"))
    still_compiling = warm_state(url, "wholeBody_ct").split()[0] in ("pending", "warming")
    assert len(during) >= 2 and (still_compiling or len(during) == 5), \
        f"the cold compile of wholeBody_ct ended after {len(during)} click(s): nothing was measured beside it"
    wait_for(lambda: warm_state(url, "wholeBody_ct").startswith("warm ("), "wholeBody_ct warm", timeout_s=900)
    compile_s = float(warm_state(url, "wholeBody_ct").split("(")[1].split()[0])
    alone = statistics.median(click(url, STUDIES[0], sample_env, "alice") for _ in range(3))
    # Beside a compiler the click shares the CPU cores (this machine's only "device"; the compiler's threads take most
    # of two cores: 4x slower clicks were seen in CI) and may wait for one warm-up forward (a background turn), but it
    # never waits for the compile, which takes far longer (before the scheduler: 93 s).
    slowest = max(during[1:])
    assert slowest <= 4 * alone + 4.0 and slowest < compile_s / 4, \
        f"clicks during the compile {during}, alone {alone:.2f} s, the compile {compile_s:.0f} s"


def test_once_every_model_is_warm_its_objects_are_out_of_the_garbage_collectors_reach(shared):
    url, _ = shared
    wait_for(lambda: warm_state(url, "wholeBody_ct").startswith("warm ("), "wholeBody_ct warm", timeout_s=900)
    wait_for(lambda: heap(url)["frozen_objects"] > 0, "the warm heap frozen", 60)
    frozen = heap(url)
    # the two tiny models' server: MONAI, MONAI Label, their configs, the compiled graphs
    assert frozen["frozen_objects"] > 200_000, frozen
    assert frozen["full_collection_before_freeze_s"] > 0, frozen


def test_info_answers_and_a_click_goes_between_window_batches_of_a_long_request(shared, sample_env):
    url, _ = shared
    alone = statistics.median(click(url, STUDIES[1], sample_env, "bob") for _ in range(3))
    out: dict = {}
    worker = automatic(url, WIDE.name, out, "wide")
    wait_for(lambda: sharing(url)["devices"]["cpu"]["turns"]["automatic"]["served"] > 0, "a window batch ran")
    info_s = []
    for _ in range(5):
        start = time.perf_counter()
        assert requests.get(f"{url}/info/", timeout=5).status_code == 200
        info_s.append(time.perf_counter() - start)
    clicks = [click(url, STUDIES[1], sample_env, "bob") for _ in range(3)]
    window_s = sharing(url)["devices"]["cpu"]["turns"]["automatic"]["mean_held_s"]
    assert "wide" not in out, f"the long request ended before the clicks were measured: {out.get('wide')}"
    assert max(info_s) < 0.5, info_s
    assert statistics.median(clicks) <= alone + window_s + 1.0, \
        f"clicks {clicks} beside the long request; alone {alone:.2f} s, one window batch {window_s:.2f} s"
    worker.join(REQUEST_TIMEOUT_S + 30)
    status, _, text, seconds = out["wide"]
    assert status == 504 and "request_timeout_s" in text, (status, text)  # the deadline, with its reason
    assert seconds < REQUEST_TIMEOUT_S + 2
    # and its work stopped at its next turn instead of running on for minutes
    wait_for(lambda: sharing(url)["queues"]["automatic"]["running"] == 0, "the dropped request let go", 30)


def test_two_clients_clicking_on_two_studies_are_served_alike(shared, sample_env):
    url, _ = shared
    times: dict[str, list[float]] = {"carol": [], "dave": []}

    def clinician(name: str, image_id: str) -> None:
        for _ in range(6):
            times[name].append(click(url, image_id, sample_env, name))
            time.sleep(0.2)  # think time

    threads = [threading.Thread(target=clinician, args=(n, s)) for n, s in zip(times, STUDIES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    p50 = {name: statistics.median(ts) for name, ts in times.items()}
    assert max(p50.values()) <= 2 * min(p50.values()), times


def test_a_full_queue_says_503_with_retry_after(shared):
    url, _ = shared
    wait_for(lambda: warm_state(url, "wholeBody_ct").startswith("warm ("), "wholeBody_ct warm", timeout_s=900)
    out: dict = {}
    first = automatic(url, WIDE.name, out, "running")
    wait_for(lambda: sharing(url)["queues"]["automatic"]["running"] == 1, "the first request running")
    second = automatic(url, STUDIES[0], out, "waiting")
    wait_for(lambda: sharing(url)["queues"]["automatic"]["waiting"] == 1, "the second request queued")
    r = requests.post(f"{url}/infer/wholeBody_ct", params={"image": STUDIES[1]},
                      files={"params": (None, "{}")}, timeout=30)
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert "full" in r.json()["detail"]
    assert requests.get(f"{url}/health/live", timeout=5).status_code == 200
    for t in (first, second):
        t.join(REQUEST_TIMEOUT_S + 60)
    assert out["running"][0] == 504, out["running"]
    wait_for(lambda: sharing(url)["queues"]["automatic"]["running"] == 0, "the queue drained", 60)


def test_a_client_that_hangs_up_has_its_work_dropped(shared):
    url, _ = shared
    wait_for(lambda: warm_state(url, "wholeBody_ct").startswith("warm ("), "wholeBody_ct warm", timeout_s=900)
    before = sharing(url)["dropped"]["disconnected"]
    out: dict = {}
    automatic(url, WIDE.name, out, "gone", timeout=3).join(30)  # the client gives up after 3 s and closes the socket
    assert out["gone"][0] in ("ReadTimeout", "ConnectionError"), out["gone"]
    wait_for(lambda: sharing(url)["dropped"]["disconnected"] == before + 1, "the server saw the client go", 10)
    # dropped at its next window batch, well before its deadline, let alone its minutes of work
    wait_for(lambda: sharing(url)["queues"]["automatic"]["running"] == 0, "its work let go",
             timeout_s=REQUEST_TIMEOUT_S - 5)


def batch_turns(url: str) -> dict:
    return sharing(url)["devices"]["cpu"]["turns"]["batch"]


def test_a_batch_steps_aside_while_clicks_are_in_progress_and_goes_on_between_them(shared, sample_env):
    url, _ = shared
    wait_for(lambda: warm_state(url, "wholeBody_ct").startswith("warm ("), "wholeBody_ct warm", timeout_s=900)
    alone = statistics.median(click(url, STUDIES[0], sample_env, "erin") for _ in range(3))
    started = requests.post(f"{url}/batch/infer/wholeBody_ct",
                            json={"image_ids": [WIDE.name], "label_tag": "sharing_test"}, timeout=30)
    assert started.status_code == 200, started.text
    clicks: dict[str, list[float]] = {"erin": [], "frank": []}
    try:
        wait_for(lambda: batch_turns(url)["served"] > 2, "the batch's sliding window runs", timeout_s=120)
        idle_from, idle_start = batch_turns(url)["served"], time.perf_counter()
        time.sleep(IDLE_S)
        idle = batch_turns(url)
        idle_rate = (idle["served"] - idle_from) / (time.perf_counter() - idle_start)
        idle_window_s = idle["mean_held_s"]
        # Two clinicians clicking back to back: a click is in progress all the time.
        stop = time.perf_counter() + 4.0

        def clinician(name: str, image_id: str) -> None:
            while time.perf_counter() < stop:
                clicks[name].append(click(url, image_id, sample_env, name))

        threads = [threading.Thread(target=clinician, args=(n, s)) for n, s in zip(clicks, STUDIES)]
        busy_from = batch_turns(url)["served"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        busy_turns = batch_turns(url)["served"] - busy_from
        window_s = batch_turns(url)["mean_held_s"]
        assert requests.get(f"{url}/batch/infer", timeout=5).json()["state"] == "running"
    finally:
        requests.delete(f"{url}/batch/infer", timeout=30)  # it stops after the study it is on
    # While nobody asks, the batch holds the device most of the time (a window batch takes 0.3-1 s on a 2-core CPU,
    # and a garbage collection or a transform between them is not its turn).
    busy_share = idle_rate * idle_window_s
    assert busy_share >= 0.5, (f"the batch held the device {busy_share:.0%} of {IDLE_S:g} s while nobody asked "
                               f"({idle_rate:.1f} window batches a second of {idle_window_s:.2f} s)")
    # The batch takes no turn while a click is in progress: at most the one each clinician's first click found it in.
    assert busy_turns <= 2, f"{busy_turns} batch turns during 4 s of clicks ({clicks}); {idle_rate:.1f} a second idle"
    # Two clinicians share two cores here: each click at most twice its time alone, plus one window batch.
    slowest = statistics.median(clicks["erin"] + clicks["frank"])
    assert slowest <= 2 * alone + window_s + 1.0, \
        f"clicks {clicks} beside the batch; alone {alone:.2f} s, one window batch {window_s:.2f} s"
