"""A missing PACS or browser skips these tests on a workstation, but fails them in CI (CI=true), where it means the
job's setup is broken and the DICOMweb/OHIF path would otherwise go untested without anyone noticing."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason: str) -> None:
    """pytest.skip(reason), or pytest.fail under CI=true (these tests must run there)."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the DICOMweb and OHIF tests must run in CI, not skip)", pytrace=False)
    pytest.skip(reason)
