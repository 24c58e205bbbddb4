"""Latency summaries for every benchmark record: percentiles of a run of samples, and per-stage medians.

A record names a percentile `p<q>` followed by its unit (`p50_ms`, `p90_s`; bare `p50` where the enclosing key names
the unit), and the markdown tables are made from those keys. The median is `statistics.median`'s (the middle sample,
or the mean of the two middle ones); other percentiles interpolate linearly between samples, as numpy's default does.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping, Sequence

import numpy as np


def percentile(samples: Iterable[float], q: float) -> float:
    values = list(samples)
    if not values:
        raise ValueError(f"no samples to take the p{q:g} of")
    if q == 50:
        return statistics.median(values)
    return float(np.percentile(np.asarray(values), q))


def summarise(samples: Iterable[float], quantiles: Sequence[float] = (50, 90), unit: str = "",
              digits: int | None = None) -> dict[str, float]:
    """`{"p50_<unit>": ..., "p90_<unit>": ...}` of the samples (keys `p50`, `p90` without a unit), each rounded to
    `digits` when given."""
    values = list(samples)
    suffix = f"_{unit}" if unit else ""
    out = {}
    for q in quantiles:
        v = percentile(values, q)
        out[f"p{q:g}{suffix}"] = v if digits is None else round(v, digits)
    return out


def medians(rows: Sequence[Mapping[str, Any]], keys: Iterable[str] | None = None, digits: int | None = None,
            missing: float | None = None) -> dict[str, float]:
    """Per key (by default the first row's), the median over the rows: a row without the key counts as `missing`,
    or is left out when `missing` is None; a key no row has is left out of the result."""
    out = {}
    for k in (rows[0] if rows and keys is None else keys or ()):
        values = [r[k] if k in r else missing for r in rows if k in r or missing is not None]
        if values:
            v = statistics.median(values)
            out[k] = v if digits is None else round(v, digits)
    return out
