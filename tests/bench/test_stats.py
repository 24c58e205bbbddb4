"""The one latency summary (rocm_zoo.bench.stats): the keys the records and their markdown tables read, the median
as statistics.median gives it, other percentiles interpolated as numpy's default, per-stage medians."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from rocm_zoo.bench.stats import medians, percentile, summarise

SAMPLES = [12.0, 10.0, 11.5, 30.0, 10.25, 10.75]  # six: the median is the mean of the two middle samples


def test_keys_name_the_percentile_and_the_unit():
    assert list(summarise(SAMPLES)) == ["p50", "p90"]
    assert list(summarise(SAMPLES, (50, 90, 99), unit="ms")) == ["p50_ms", "p90_ms", "p99_ms"]
    assert list(summarise(SAMPLES, unit="s")) == ["p50_s", "p90_s"]
    assert list(summarise(SAMPLES, (99.9,), unit="ms")) == ["p99.9_ms"]


def test_values_are_the_median_and_numpys_linear_percentiles_as_before():
    s = summarise(SAMPLES, (50, 90, 99), unit="ms")
    assert s["p50_ms"] == statistics.median(SAMPLES) == 11.125
    assert s["p90_ms"] == float(np.percentile(SAMPLES, 90)) == 21.0  # between 12 and 30, half-way
    assert s["p99_ms"] == float(np.percentile(SAMPLES, 99))
    assert percentile([3.0], 90) == 3.0 and percentile([1, 2, 3], 50) == 2


def test_rounding_only_when_asked():
    assert summarise(SAMPLES, digits=1) == {"p50": 11.1, "p90": 21.0}  # 11.125 rounds half to even
    assert summarise([1 / 3, 2 / 3, 1.0], (50,), digits=3) == {"p50": 0.667}
    assert summarise([1 / 3, 2 / 3, 1.0], (50,)) == {"p50": 2 / 3}


def test_no_samples_is_an_error_that_says_so():
    with pytest.raises(ValueError, match="no samples to take the p90 of"):
        summarise([], (90,))


def test_medians_per_stage_of_the_first_rows_keys_by_default():
    rows = [{"pre": 0.1, "infer": 1.0}, {"pre": 0.3, "infer": 3.0}, {"pre": 0.2, "infer": 2.0}]
    assert medians(rows) == {"pre": 0.2, "infer": 2.0}
    assert medians(rows, ["infer"]) == {"infer": 2.0}


def test_medians_of_a_stage_some_rows_lack():
    rows = [{"pre": 0.1, "write": 0.5}, {"pre": 0.3}, {"pre": 0.2, "write": 0.9}]
    assert medians(rows, ["pre", "write", "invert"]) == {"pre": 0.2, "write": 0.7}, "left out; a stage nobody has too"
    assert medians(rows, digits=3, missing=0.0) == {"pre": 0.2, "write": 0.5}, "counted as 0 (the batch record)"
    assert medians([]) == {}
