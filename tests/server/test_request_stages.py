"""request_stages: stages add up per request, the log line reads back, the response gets them next to MONAI Label's
own latencies."""

from __future__ import annotations

import time

from rocm_zoo.server.http import request_stages as rs


def test_stages_add_up_within_a_recording_and_not_outside():
    rs.add("fetch_series", 1.0)  # no recording open: dropped
    with rs.recording() as stages:
        with rs.timed("fetch_series"):
            time.sleep(0.01)
        with rs.timed("fetch_series"):  # a second look-up of the same request counts too
            time.sleep(0.01)
        rs.add("store", 0.5)
    assert 0.02 <= stages["fetch_series"] < 0.5 and stages["store"] == 0.5
    assert "convert" not in stages


def test_report_fills_all_five_stages_and_the_line_reads_back():
    result = {"params": {"latencies": {"pre": 0.12, "infer": 0.5, "invert": 0.0, "post": 0.03, "write": 0.02,
                                       "total": 0.67, "transform": {}}}}
    s = rs.report(result, {"fetch_series": 0.0312, "encode_seg": 0.2}, 1.0, "wholeBody_ct", "1.2.840.1")
    assert result["params"]["latencies"]["stages"] == {"fetch_series": 0.0312, "convert": 0.0, "infer": 0.67,
                                                       "encode_seg": 0.2, "store": 0.0, "request": 1.0}
    assert result["params"]["latencies"]["infer"] == 0.5  # MONAI Label's own keys untouched
    line = rs.format_line("wholeBody_ct", "1.2.840.1", s)
    back = rs.parse_line("2026-12-02 10:00:00 [INFO] (rocm_zoo.server.http.request_stages) - " + line)
    assert back["model"] == "wholeBody_ct" and back["image"] == "1.2.840.1"
    assert back["fetch_series"] == 0.031 and back["infer"] == 0.67 and back["request"] == 1.0  # ms in the log
    assert back["task"] == {"pre": 0.12, "infer": 0.5, "invert": 0.0, "post": 0.03, "write": 0.02}
    assert rs.parse_line("series 1.2.3 fetched in 0.20 s") is None


def test_a_failed_task_without_latencies_still_reports():
    s = rs.report({"params": {}}, {}, 0.25, "vista3d", "x")
    assert s["infer"] == 0.0 and s["request"] == 0.25
