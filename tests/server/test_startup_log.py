"""The start-up log of `--conf models all` at INFO, as an admin reads it in the terminal: short, and true about CORS,
the garbage collector and CUDA (the shared server's own log, written by the real start)."""

from __future__ import annotations

import re

import pytest
import requests

pytestmark = pytest.mark.slow

# MONAI Label's launcher prints its 20 `USING::` argument lines before the app is imported; ours come after them.
MOST_LINES_UNTIL_SERVING = 45


def test_the_start_up_log_is_short_and_says_what_matters(server, sample_env):
    assert requests.get(f"{server}/health/ready", timeout=30).status_code == 200
    lines = (sample_env.root / "server.log").read_text().splitlines()
    serving = next(i for i, line in enumerate(lines) if "Uvicorn running on" in line)
    start = lines[:serving + 1]
    assert len(start) <= MOST_LINES_UNTIL_SERVING, "\n".join(start)
    assert not [line for line in lines if "; Label: " in line], "MONAI Label's per-label tables are for DEBUG"
    # Our warm-up's inferences are not a user's requests: none of MONAI Label's per-transform lines for them.
    assert not [line for line in lines if re.search(r"\[rocm_zoo-warm\] \[INFO\] \(monailabel\.", line)]
    # One CORS statement of ours, which says it replaces the `Allow Origins: ['*']` MONAI Label printed.
    cors = [line for line in start if "CORS" in line]
    assert len(cors) == 1 and "none, same origin only" in cors[0] and "in place of" in cors[0], cors
    # On this CPU machine: no word of a CUDA toolkit, and no collector warning before the warm heap is frozen.
    assert not [line for line in lines if "No CUDA runtime" in line]
    frozen = next((i for i, line in enumerate(lines) if "out of the garbage collector's reach" in line), len(lines))
    assert not [line for line in lines[:frozen] if "stopped every thread" in line]
