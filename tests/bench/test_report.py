"""`rocm-zoo bench-report`: the current table in docs/benchmarks.md is what docs/benchmarks/current.json and the
records it names make, and a broken index or record is a clear error, not a wrong table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rocm_zoo.bench import report
from rocm_zoo.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"
INDEX, MARKDOWN, CHART = DOCS / "benchmarks" / "current.json", DOCS / "benchmarks.md", DOCS / "benchmarks" / "current.png"


def test_the_committed_table_is_what_the_records_make():
    assert report.check_report(index=INDEX, markdown=MARKDOWN, chart=CHART), \
        "docs/benchmarks.md's current table differs from the records: run `rocm-zoo bench-report`"
    assert main(["bench-report", "--check", "--index", str(INDEX), "--markdown", str(MARKDOWN),
                 "--chart", str(CHART)]) == 0
    assert CHART.is_file()


def test_every_row_reads_a_number_from_an_existing_record():
    rows = report.load_rows(INDEX)
    assert len(rows) == len(json.loads(INDEX.read_text())["rows"])
    for row in rows:
        assert row.today.value > 0 and not row.today.prose
        assert (INDEX.parent / row.today.source).is_file()


@pytest.fixture
def small(tmp_path):
    """An index of two rows over two tiny records, and a markdown with the markers."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "bench.json").write_text(json.dumps(
        {"rows": [{"variant": "fp32", "p50_ms": 30.0}, {"variant": "overlay", "p50_ms": 10.0}]}))
    (tmp_path / "run" / "batch.json").write_text(json.dumps({"p50_s": 1.5}))
    index = {"rows": [
        {"bundle": "b", "figure": "forward", "unit": "ms", "device": "GPU", "date": "2026-01-01",
         "today": {"record": "run/bench.json", "path": ["rows", {"variant": "overlay"}, "p50_ms"]},
         "baseline": {"record": "run/bench.json", "path": ["rows", 0, "p50_ms"], "is": "fp32 eager"},
         "target": {"value": 12, "is": "ref"}},
        {"bundle": "b", "figure": "study", "unit": "ms", "device": "GPU", "date": "2026-01-01",
         "today": {"record": "run/batch.json", "path": ["p50_s"], "unit": "s"},
         "baseline": {"prose": "Batch run", "value": 4.5, "unit": "s", "is": "stock"}}]}
    (tmp_path / "current.json").write_text(json.dumps(index))
    (tmp_path / "bench.md").write_text(f"# B\n\n{report.BEGIN}\nold\n{report.END}\n\n## Batch run\ntext\n")
    return tmp_path


def test_the_table_is_written_between_the_markers_with_units_speed_up_and_links(small):
    rows = report.write_report(index=small / "current.json", markdown=small / "bench.md", chart=None)
    text = (small / "bench.md").read_text()
    assert text.startswith("# B\n\n") and text.endswith("## Batch run\ntext\n") and "old" not in text
    assert "| b | forward | **10.00 ms** | 30.00 ms (fp32 eager) | 3.00x | 12 ms (ref) | yes |" in text
    assert "[run/bench.json](run/bench.json)" in text
    assert "**1,500 ms** | 4,500 ms (stock) | 3.00x" in text  # seconds in the record, milliseconds in the row
    assert "prose only: [section](#batch-run)" in text
    assert [r.today.value for r in rows] == [10.0, 1500.0]
    assert report.check_report(index=small / "current.json", markdown=small / "bench.md", chart=None)


def test_the_chart_is_drawn(small):
    report.write_report(index=small / "current.json", markdown=small / "bench.md", chart=small / "c.png")
    assert (small / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_record_is_a_clear_error(small):
    (small / "run" / "batch.json").unlink()
    with pytest.raises(report.ReportError, match=r"row 2 \(b, study\): record run/batch.json not found"):
        report.load_rows(small / "current.json")
    with pytest.raises(SystemExit, match="record run/batch.json not found"):
        main(["bench-report", "--index", str(small / "current.json"), "--markdown", str(small / "bench.md"),
              "--no-chart"])
    assert "old" in (small / "bench.md").read_text()  # nothing written


def test_a_path_that_does_not_lead_to_one_number_is_a_clear_error(small):
    index = json.loads((small / "current.json").read_text())
    for path, message in ((["rows", {"variant": "none"}, "p50_ms"], "expected one element matching"),
                          (["rows", 0, "p90_ms"], "expected key 'p90_ms'"),
                          (["rows", 0], "expected a number")):
        index["rows"][0]["today"]["path"] = path
        (small / "current.json").write_text(json.dumps(index))
        with pytest.raises(report.ReportError, match=message):
            report.load_rows(small / "current.json")


def test_markdown_without_the_markers_is_a_clear_error(small):
    (small / "bench.md").write_text("# B\n")
    with pytest.raises(report.ReportError, match="current-table:begin"):
        report.write_report(index=small / "current.json", markdown=small / "bench.md", chart=None)


def test_a_stale_table_fails_the_check(small):
    report.write_report(index=small / "current.json", markdown=small / "bench.md", chart=None)
    bench = json.loads((small / "run" / "bench.json").read_text())
    bench["rows"][1]["p50_ms"] = 9.0
    (small / "run" / "bench.json").write_text(json.dumps(bench))
    assert not report.check_report(index=small / "current.json", markdown=small / "bench.md", chart=None)
    shutil.rmtree(small / "run")
    with pytest.raises(report.ReportError, match="not found"):
        report.check_report(index=small / "current.json", markdown=small / "bench.md", chart=None)
