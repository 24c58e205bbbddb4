"""Which GPU stream a request queues its kernels on: clicks on a high-priority stream of their worker thread,
everything else on the device's default stream.

The scheduler's turns order the network runs, but a request also runs kernels between its turns: preprocessing,
stitching, softmax, argmax and inversion of a whole-body study. On one shared stream a click's kernels queue behind
those, and the click's copy of its mask to the host waits for all of them. On a stream of its own the click waits for
neither, and where both streams have work the GPU runs the high-priority stream's blocks first; the scheduler
therefore lets a click on such a stream run without waiting for a turn. Each worker thread has its own, so two clicks
of different models run side by side. HIP has stream priorities too, so ROCm runs the same code; on a device without
priorities the stream gets priority 0, and its clicks take queued turns as on one stream. Off with
`--conf interactive_stream false` (the comparison in docs/benchmarks.md).

Tensors that outlive a request and are read by requests of other classes (the preprocessed-image cache, VISTA3D's
encoder outputs) cross streams: whoever makes one marks it `ready` on its stream; whoever reads one calls `use_here`,
so the reading stream waits for the maker's kernels and the allocator does not hand that memory to another stream
before the reader's kernels are done with it.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any, ContextManager, Iterator

import torch

_enabled = True
_streams = threading.local()  # per thread and device: two clicks' kernels do not queue behind each other either
# Beyond the device's range, torch maps a priority to the highest one the device has.
HIGHEST_PRIORITY = -64


def set_interactive_stream(enabled: bool) -> None:
    global _enabled
    _enabled = enabled


def interactive_stream_enabled() -> bool:
    return _enabled


def for_work(device: str, interactive: bool) -> ContextManager:
    """The stream that work on `device` runs on (a click's is `interactive`), as the thread's current stream for the
    block."""
    if not (_enabled and interactive and device.startswith("cuda")):
        return nullcontext()
    return torch.cuda.stream(_interactive_stream(device))


def _interactive_stream(device: str) -> Any:
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    mine = _streams.__dict__.setdefault("by_device", {})
    if index not in mine:
        mine[index] = torch.cuda.Stream(device=index, priority=HIGHEST_PRIORITY)
    return mine[index]


def on_interactive_stream(device: str) -> bool:
    """Does this thread run on a high-priority stream of `device` now? The GPU then runs its kernels ahead of other
    streams' by itself, so its turns need not wait in the scheduler's queue (rocm_zoo.engine.scheduler)."""
    return _enabled and torch.cuda.current_stream(device).priority < 0


def _cuda_tensors(value: Any) -> Iterator[torch.Tensor]:
    if torch.is_tensor(value):
        if value.is_cuda:
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _cuda_tensors(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _cuda_tensors(v)


def ready(value: Any) -> Any:
    """An event on the current stream after the kernels that made `value`'s GPU tensors (None without any)."""
    first = next(_cuda_tensors(value), None)
    if first is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(first.device))
    return event


def use_here(value: Any, made: Any) -> None:
    """Before the current stream reads `value`: wait for `made` (from `ready`), and keep the memory of its GPU
    tensors from other streams until the current stream's work queued so far is done."""
    for t in _cuda_tensors(value):
        stream = torch.cuda.current_stream(t.device)
        if made is not None:
            stream.wait_event(made)
            made = None
        torch.Tensor.record_stream(t.as_tensor() if hasattr(t, "as_tensor") else t, stream)  # MetaTensors too
