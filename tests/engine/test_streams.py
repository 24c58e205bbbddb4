"""Which stream a piece of work runs on (engine.streams). No GPU here: the selection is tested, the streams themselves
run on the H200 (docs/benchmarks.md, "the shared server under mixed load")."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from rocm_zoo.engine import streams


@pytest.fixture
def chosen(monkeypatch):
    """The streams `for_work` would enter, by device, instead of entering them."""
    picked: list[str] = []
    monkeypatch.setattr(streams, "_interactive_stream", lambda device: picked.append(device) or f"stream {device}")
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext(s))
    yield picked
    streams.set_interactive_stream(True)


def test_clicks_on_a_gpu_run_on_its_interactive_stream(chosen):
    with streams.for_work("cuda:1", interactive=True) as s:
        assert s == "stream cuda:1"
    assert chosen == ["cuda:1"]


def test_other_work_stays_on_the_default_stream(chosen):
    with streams.for_work("cuda", interactive=False) as s:
        assert s is None
    assert chosen == []


def test_no_stream_on_a_cpu_or_when_turned_off(chosen):
    with streams.for_work("cpu", interactive=True) as s:
        assert s is None
    streams.set_interactive_stream(False)
    with streams.for_work("cuda", interactive=True) as s:
        assert s is None
    assert chosen == [] and not streams.interactive_stream_enabled()


def test_host_tensors_need_no_event_and_no_bookkeeping():
    value = {"image": torch.zeros(2, 3), "meta": {"spacing": [1.0, 1.0]}, "list": [torch.ones(1), None]}
    assert streams.ready(value) is None
    streams.use_here(value, None)  # nothing to wait for, nothing to record
