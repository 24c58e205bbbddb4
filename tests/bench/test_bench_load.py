"""`rocm-zoo bench-load`: the loopback rule, the outcome of each request, the summaries, ratios and targets made from
the samples, the markdown and plot made from the record (fast); and one short run of Locust users against the shared
server (slow)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from rocm_zoo.bench import load_report, load_stats
from rocm_zoo.bench.load import organ_clicks, run_phase
from rocm_zoo.bench.load_plan import LoadBenchError, Mix, Phase, Study, Targets, check_loopback, phases
from rocm_zoo.bench.server_resources import growth
from rocm_zoo.engine.masks import central_voxel

URL = "http://127.0.0.1:8000"


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.3.4.5:9/", "http://localhost:8000",
                                 "http://[::1]:8000", "https://LOCALHOST"])
def test_loopback_urls_are_accepted(url):
    assert check_loopback(url) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://0.0.0.0:8000", "http://example.org",
                                 "http://localhost.example.org", "http://128.0.0.1", "ftp://127.0.0.1", "127.0.0.1:80"])
def test_any_other_host_is_refused_with_the_rule(url):
    with pytest.raises(LoadBenchError, match="loopback|http"):
        check_loopback(url)


def _targets(**kw) -> Targets:
    study = Study("s0", ((1, 2, 3), (2, 2, 3)), (10, 10, 10))
    return Targets(url=URL, studies=(study,), automatic_images=("s0",), **kw)


def test_phases_put_each_class_alone_before_the_mix_and_round_trip_as_json():
    mix = Mix(deepedit=2, vista3d=1, automatic=1, bad=1, monitor=1, batch="wholeBody_ct")
    got = phases(mix, _targets(), duration_s=60, baseline_s=10)
    assert [p.name for p in got] == ["deepedit alone", "vista3d alone", "automatic alone", "monitor alone", "mixed"]
    assert got[0].mix.counts() == {"DeepEditClinician": 1} and got[0].duration_s == 10
    assert got[-1].mix.counts() == {"DeepEditClinician": 2, "Vista3dClinician": 1, "AutomaticRequester": 1,
                                    "BadRequester": 1, "Monitor": 1, "BatchStarter": 1}
    assert Phase.from_json(got[-1].to_json()) == got[-1]
    assert [p.name for p in phases(mix, _targets(), 60)] == ["mixed"]


def test_unbounded_or_off_loopback_phases_are_refused():
    with pytest.raises(LoadBenchError, match="1 to 64"):
        Phase("mixed", Mix(deepedit=65), 10, _targets()).check()
    with pytest.raises(LoadBenchError, match="at most"):
        Phase("mixed", Mix(deepedit=1), 10 * 24 * 3600, _targets()).check()
    with pytest.raises(LoadBenchError, match="users"):
        Phase("mixed", Mix(), 10, _targets()).check()
    with pytest.raises(LoadBenchError, match="loopback"):
        Phase("mixed", Mix(deepedit=1), 10, Targets(url="http://192.168.1.2:8000", studies=())).check()
    with pytest.raises(LoadBenchError, match="spleen"):
        Phase("mixed", Mix(vista3d=1), 10, Targets(url=URL, studies=())).check()


def _s(name, t, ms, status=200, expect="ok", user="U", error=None):
    return {"name": name, "t": t, "ms": ms, "status": status, "expect": expect, "user": user, "error": error}


@pytest.mark.parametrize("status,expect,want", [
    (200, "ok", "ok"), (404, "ok", "error"), (422, "ok", "error"), (500, "ok", "error"), (0, "ok", "error"),
    (422, "4xx", "intended_4xx"), (404, "4xx", "intended_4xx"), (200, "4xx", "error"), (500, "4xx", "error"),
    (404, "ok_or_404", "not_available"), (200, "ok_or_404", "ok"), (500, "ok_or_404", "error"),
    (503, "ok", "overload"), (504, "4xx", "overload")])
def test_outcome_of_each_answer(status, expect, want):
    assert load_stats.outcome(_s("x", 0, 1, status, expect)) == want


def test_series_summary_counts_outcomes_percentiles_and_throughput_inside_the_window():
    start = 1000.0
    rows = [_s("click", start + i, ms) for i, ms in enumerate(range(10, 110, 10))]  # 10..100 ms, one per second
    rows.append(_s("click", start + 9.99, 500))  # completes after the 10 s window: latency counts, throughput not
    rows.append(_s("click", start + 3, 7, status=500, error="HTTPError: boom"))
    rows.append(_s("click", start + 4, 9000, status=503))
    s = load_stats.summarise_series(rows, start, 10.0)
    assert (s["requests"], s["ok"], s["error"], s["overload"]) == (13, 11, 1, 1)
    assert s["p50_ms"] == 60.0 and s["max_ms"] == 500.0  # percentiles over the 11 answered, not the failures
    assert s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
    assert s["throughput_per_s"] == 1.0
    assert s["problems"] == {"500 HTTPError: boom": 1, "503": 1}


def test_phase_summary_timeline_ratios_and_targets():
    start = 0.0
    alone = [_s("deepedit click", i, 100) for i in range(10)] + [_s("automatic wholeBody_ct", i, 900)
                                                                 for i in range(10)]
    mixed = [_s("deepedit click", i, 140 + i) for i in range(10)] + [_s("automatic wholeBody_ct", i, 900)
                                                                     for i in range(0, 10, 2)]
    mixed += [_s("GET /health/live", i, 5, 404, "ok_or_404") for i in range(10)]
    mixed += [_s("GET /info/", i, 20) for i in range(10)]
    record = {"phases": {"alone": load_stats.summarise_phase(alone, start, 10),
                         "mixed": load_stats.summarise_phase(mixed, start, 10)}}
    assert record["phases"]["mixed"]["not_available"] == 10 and record["phases"]["mixed"]["error"] == 0
    tl = record["phases"]["mixed"]["timeline"]["deepedit click"]
    assert [r[0] for r in tl] == [float(i) for i in range(10)] and tl[3][1:] == [1, 143.0, 143.0, 0]
    record["ratios"] = load_stats.ratios(record["phases"])
    assert record["ratios"]["automatic wholeBody_ct"]["throughput_per_s"] == 0.5
    assert record["ratios"]["deepedit click"]["p50_ms"] == pytest.approx(1.445)
    checks = {c["target"]: c for c in load_stats.check_targets(record)}
    assert checks["deepedit click p90_ms <= 150"]["met"] is True
    assert checks["automatic wholeBody_ct throughput_ratio >= 0.7"] == {
        "target": "automatic wholeBody_ct throughput_ratio >= 0.7", "value": 0.5, "met": False}
    assert checks["GET /info/ p99_ms <= 50"]["met"] is True
    assert checks["GET /health/live p99_ms <= 50"]["met"] is None  # 404 only: not measured, neither met nor failed
    assert checks["vista3d click p90_ms <= 300"]["met"] is None
    assert checks["all requests errors <= 0"]["met"] is True


def test_organ_clicks_lie_inside_the_organ_central_voxel_first():
    truth = np.zeros((20, 20, 10), np.uint8)
    truth[5:12, 6:14, 2:8] = 1
    clicks = organ_clicks(truth, 1, count=4, seed=3)
    assert len(clicks) == 4 and len({tuple(c) for c in clicks}) == 4
    assert all(truth[tuple(c)] == 1 for c in clicks)
    assert clicks[0] == central_voxel(truth == 1)
    assert organ_clicks(truth, 2) == []


def test_memory_growth_compares_first_and_last_tenth():
    rows = [{"rss_mb": 100.0}] * 10 + [{"rss_mb": 150.0}] * 80 + [{"rss_mb": 104.0}] * 10
    assert growth(rows, "rss_mb") == {"start": 100.0, "end": 104.0, "max": 150.0, "growth_pct": 4.0, "samples": 100}
    assert growth(rows, "gpu_mb") is None


def _record(tmp_path) -> dict:
    samples = [_s("deepedit click", 100 + i, 50 + i, user="DeepEditClinician") for i in range(20)]
    samples += [_s("bad: unknown model", 100 + i, 3, 404, "4xx", "BadRequester") for i in range(5)]
    phase = {"mix": Mix(deepedit=1, bad=1).__dict__, "duration_s": 20, "start": 100.0,
             **load_stats.summarise_phase(samples, 100.0, 20)}
    record = {"date": "2026-01-01T00:00:00+00:00", "command": "rocm-zoo bench-load", "think_time_s": 1.0,
              "versions": {"locust": "2.47.0"}, "server": {"url": URL, "backend": "cpu"}, "start": 100.0,
              "phases": {"mixed": phase},
              "resources": {"samples": [{"t": 100.0 + i, "rss_mb": 900.0 + i} for i in range(20)],
                            "rss_mb": {"start": 900.0, "end": 919.0, "max": 919.0, "growth_pct": 2.11,
                                       "samples": 20}}}
    record["targets"] = load_stats.check_targets(record)
    return record


def test_markdown_and_plot_are_made_from_the_record(tmp_path):
    record = _record(tmp_path)
    md = load_report.markdown(record)
    assert "### mixed: 1 deepedit, 1 bad, 20 s" in md
    row = next(line for line in md.splitlines() if line.startswith("| deepedit click |"))
    assert row.split(" | ")[2:5] == ["20", "59.5", "67.1"]  # requests, p50, p90 of 50..69 ms
    assert "| bad: unknown model | BadRequester | 5 |" in md and "| RSS MiB | 900.0 | 919.0 | 919.0 | +2.1% |" in md
    assert "| deepedit click p90_ms <= 150 | 67.1 | yes |" in md
    assert "| vista3d click p90_ms <= 300 | - | not measured |" in md
    png = load_report.plot(record, tmp_path / "load.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_the_benchmark_process_never_imports_locust():
    """Locust patches the standard library with gevent on import: only its own child process may import it."""
    code = ("import sys, rocm_zoo.cli, rocm_zoo.bench.load, rocm_zoo.bench.load_report; "
            "rocm_zoo.cli.parser().parse_args(['bench-load']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('locust', 'gevent')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_bench_load_starts_a_server_and_loads_it(sample_env, tmp_path):
    """The CLI in a process of its own, 15 s: it starts a server on the sample studies and tiny bundles with the
    models the mix needs (spleen_deepedit: DeepEdit and its automatic twin, one network; the shared server's
    background warm-ups of all five networks take 15+ minutes on 2 shared cores, which bench-load would wait for),
    then one DeepEdit clinician, one automatic requester (spleen_deepedit_seg, one forward: the tiny wholeBody_ct
    takes 40-60 s a request here), one bad requester, one hostile one and the monitor: every attack is refused with a
    4xx and leaves nothing in the server's temporary folder."""
    out = tmp_path / "load"
    cmd = [sys.executable, "-m", "rocm_zoo.cli", "bench-load", "--app", str(sample_env.app_dir),
           "--studies", str(sample_env.paths.studies), "--truth", str(sample_env.paths.truth), "--device", "cpu",
           "--deepedit", "1", "--vista3d", "0", "--automatic", "1", "--automatic-model", "spleen_deepedit_seg",
           "--automatic-image", "phantom_test0", "--bad", "1", "--hostile", "1", "--image", "phantom_test1", "--think-time", "0.5",
           "--duration", "15", "--request-timeout", "120", "--out", str(out)]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(sample_env.root / "inductor"))  # the shared server's cache
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1000, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "load.json").read_text())
    assert record["server"]["started_by_bench_load"] and record["server"]["pid"] > 0
    assert set(record["server"]["warm"]) == {"spleen_deepedit", "spleen_deepedit_seg"}
    assert "server.log" in os.listdir(out)
    mixed = record["phases"]["mixed"]
    series = mixed["series"]
    assert {"deepedit click", "automatic spleen_deepedit_seg", "GET /info/", "bad: unknown model",
            "bad: click outside"} <= set(series), series.keys()
    for name in ("deepedit click", "automatic spleen_deepedit_seg", "GET /info/"):
        s = series[name]
        assert s["requests"] > 0 and s["ok"] == s["requests"], (name, s)
        assert 0 < s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"], (name, s)
        assert s["throughput_per_s"] > 0
    assert series["bad: unknown model"]["intended_4xx"] == series["bad: unknown model"]["requests"] > 0
    assert series["bad: click outside"]["intended_4xx"] == series["bad: click outside"]["requests"] > 0
    attacks = {name: s for name, s in series.items() if name.startswith("hostile: ")}
    assert len(attacks) == 6, attacks.keys()
    for name, s in attacks.items():
        assert s["intended_4xx"] == s["requests"] > 0, (name, s)
    assert mixed["error"] == 0 and mixed["overload"] == 0
    for route in ("GET /health/live", "GET /health/ready"):  # 404 until the server has them: not an error
        assert series[route]["ok"] + series[route]["not_available"] == series[route]["requests"] > 0
    # think time: one clinician clicking every 0.5 s plus its click's latency cannot exceed 2 clicks a second
    assert series["deepedit click"]["throughput_per_s"] <= 2.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == mixed["requests"]
    assert all(started <= s["t"] <= time.time() for s in samples)
    rss = record["resources"]["rss_mb"]
    assert rss and rss["samples"] >= 10 and rss["start"] > 100, record["resources"].get("note")
    assert record["resources"]["open_files"]["max"] > 0
    temp = record["resources"]["temp_mb"]
    assert temp and temp["end"] - temp["start"] < 1, temp  # every refused upload is removed: nothing piles up
    # MONAI Label names an upload's temporary file or folder tmp*; what it wrote there at start (its logging config)
    # is older than the load
    uploads_left = [p.name for p in (out / "server-tmp").iterdir()
                    if p.name.startswith("tmp") and p.stat().st_mtime >= record["start"]]
    assert not uploads_left, uploads_left
    assert "| deepedit click | DeepEditClinician |" in (out / "load.md").read_text()
    assert (out / "load.png").read_bytes()[:4] == b"\x89PNG"


class _Stub(http.server.BaseHTTPRequestHandler):
    """Answers as the server would, instantly: 404 for an unknown model and the health routes, 422 for a click
    outside the image (the stub's studies are 10^3), 200 otherwise; remembers each request."""

    seen: list = []  # (method, path, body)

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode(errors="replace") if length else ""
        _Stub.seen.append((self.command, self.path, body))
        status = 200
        if "/no_such_model" in self.path or self.path.startswith("/health"):
            status = 404
        elif "[20, 20, 20]" in body:
            status = 422
        self.send_response(status)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


def test_a_locust_phase_in_its_own_process_against_a_stub_server(tmp_path):
    """The Locust child: every class sends what it should, clinicians think between clicks, requests are written with
    what the parent needs, and the phase stops by itself."""
    _Stub.seen.clear()
    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    try:
        targets = Targets(url=f"http://127.0.0.1:{stub.server_port}", automatic_images=("s0",), think_time_s=0.5,
                          studies=(Study("s0", ((1, 2, 3), (2, 2, 3)), (10, 10, 10)),), request_timeout_s=5)
        phase = Phase("mixed", Mix(deepedit=1, vista3d=1, automatic=1, bad=1, monitor=1, batch="wholeBody_ct"), 3.0,
                      targets).check()
        samples, start = run_phase(phase, tmp_path, sampler=None)
    finally:
        stub.shutdown()
    summary = load_stats.summarise_phase(samples, start, phase.duration_s)
    series = summary["series"]
    assert summary["error"] == 0, {k: v.get("problems") for k, v in series.items()}
    assert series["deepedit click"]["ok"] >= 3 and series["vista3d click"]["ok"] >= 3
    assert series["deepedit click"]["requests"] <= 3 / 0.5 + 1  # think time between clicks
    assert series["automatic wholeBody_ct"]["ok"] > 20  # back to back, no think time
    assert series["bad: unknown model"]["intended_4xx"] + series["bad: click outside"]["intended_4xx"] >= 3
    assert series["GET /health/live"]["not_available"] >= 2 and series["GET /info/"]["ok"] >= 2
    assert series["batch start"]["ok"] == 1 and series["batch stop"]["ok"] == 1
    assert all(s["phase"] == "mixed" and start <= s["t"] < start + phase.duration_s + 1 for s in samples)
    assert max(s["t"] for s in samples) > start + phase.duration_s - 1, "the phase ran for its duration"
    def sent(route: str) -> list[dict]:  # the params form field of each POST to the route
        return [json.loads(b.split("\r\n\r\n", 1)[1].split("\r\n--", 1)[0])
                for m, p, b in _Stub.seen if m == "POST" and p.split("?")[0] == route]

    clicks = [d for d in sent("/infer/spleen_deepedit") if d["client_id"] != "bench-load-bad"]
    assert [len(d["spleen"]) for d in clicks][:3] == [1, 2, 1]  # the study has two clicks: one, both, one again
    assert clicks[0]["spleen"] == [[1, 2, 3]] and clicks[0]["label"] == "spleen"
    assert clicks[0]["result_extension"] == ".nrrd" and clicks[0]["client_id"].startswith("bench-load-DeepEdit")
    vista = sent("/infer/vista3d")[0]
    assert vista["points"] == [[1, 2, 3]] and vista["label_prompt"] == [3] and vista["point_labels"] == [1]
    assert any(p.startswith("/infer/vista3d?") and "output=image" in p for _, p, _ in _Stub.seen)
    assert ("POST", "/batch/infer/wholeBody_ct?images=all") in {(m, p) for m, p, _ in _Stub.seen}
