"""The garbage collector's pauses: timed and logged when slow, and the warm heap frozen out of a full collection's
walk. Real collections over real objects (no server here; tests/server/test_server_sharing.py checks the server's)."""

from __future__ import annotations

import gc
import logging
import time

import pytest

from rocm_zoo.app.heap import PauseWatch

HEAP_LOGGER = "rocm_zoo.app.heap"  # caplog also holds other threads' records: the checks read this logger's only


@pytest.fixture
def watch():
    w = PauseWatch().install()
    yield w
    w.uninstall()
    gc.unfreeze()


def full_collection_s() -> float:
    start = time.perf_counter()
    gc.collect()
    return time.perf_counter() - start


def test_a_slow_collection_is_counted_and_warned_of_once_the_heap_is_frozen(watch, caplog):
    watch.slow_s = 0.0  # every collection counts as slow here
    with caplog.at_level(logging.DEBUG, logger=HEAP_LOGGER):
        gc.collect()  # warming up: counted, logged at DEBUG only
    assert watch.info()["slow_collections"] >= 1
    assert "stopped every thread" in caplog.text
    assert not [r for r in caplog.records if r.name == HEAP_LOGGER and r.levelno >= logging.WARNING]
    watch.freeze_warm_heap()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=HEAP_LOGGER):
        gc.collect()
    info = watch.info()
    assert info["collections"] >= 1 and info["slow_collections"] >= 1 and info["longest_collection_s"] >= 0
    assert "stopped every thread" in caplog.text


def test_the_freezes_own_collection_is_reported_once_not_warned_of(watch, caplog):
    watch.slow_s = 0.0
    with caplog.at_level(logging.INFO, logger=HEAP_LOGGER):
        watch.freeze_warm_heap()
    assert not [r for r in caplog.records if r.name == HEAP_LOGGER and r.levelno >= logging.WARNING]
    assert "out of the garbage collector's reach" in caplog.text


def test_freezing_takes_the_warm_objects_out_of_every_later_collection(watch):
    warm = [{"i": i, "list": [i]} for i in range(300_000)]  # long-lived containers, as a warm server's
    before = min(full_collection_s() for _ in range(3))
    watch.freeze_warm_heap()
    after = min(full_collection_s() for _ in range(3))
    info = watch.info()
    assert info["frozen_objects"] >= 600_000 and info["full_collection_before_freeze_s"] > 0
    assert info["collections"] == 3, "counts start again at the freeze"
    assert after < before / 5, f"a full collection: {before * 1000:.1f} ms before the freeze, {after * 1000:.1f} after"
    del warm
