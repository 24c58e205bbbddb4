"""Which code a run of a warm network takes while its compiled graphs are being built, and after: so that no request
waits for a compiler and none compiles (the pool's `compile=False` networks, `engine.pool`)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from rocm_zoo.engine.fx_threads import isolate_fx_tracing_patches
from rocm_zoo.engine.overlay import OverlaySettings, submodules_to_compile


class CompileSwitch:
    """Which code a run of a network takes: the compiled graphs only where they are built. The thread building them
    (compiling and warming) runs them; every other thread runs the eager module meanwhile, and afterwards runs compiled
    at the shapes that were warmed (the whole network) or everywhere (compiled submodules, which bring their own
    dynamic shapes). So no request waits for a compiler, and none compiles: a shape nobody warmed runs eager."""

    def __init__(self) -> None:
        isolate_fx_tracing_patches()  # else a module run eager meanwhile can enter the compiling thread's FX tracer
        self._local = threading.local()
        self._builders = 0
        self._guard = threading.Lock()
        self.built = False  # a build has ended: the compiled code is warm

    @contextmanager
    def building(self) -> Iterator[None]:
        """Around compiling and warming, in the thread that does it (nested calls are one build)."""
        depth = getattr(self._local, "building", 0)
        self._local.building = depth + 1
        if depth == 0:
            with self._guard:
                self._builders += 1
        try:
            yield
        finally:
            self._local.building = depth
            if depth == 0:
                with self._guard:
                    self._builders -= 1
                    self.built = True

    def building_here(self) -> bool:
        return bool(getattr(self._local, "building", 0))

    def building_elsewhere(self) -> bool:
        return self._builders > (1 if self.building_here() else 0)

    @contextmanager
    def running(self, compiled: bool) -> Iterator[None]:
        """Around one run: what this thread's compiled submodules take (see `switchable_submodules`)."""
        before = getattr(self._local, "compiled", False)
        self._local.compiled = compiled
        try:
            yield
        finally:
            self._local.compiled = before

    def compiled_here(self) -> bool:
        return getattr(self._local, "compiled", False)


def switchable_submodules(network: nn.Module, settings: OverlaySettings, switch: CompileSwitch) -> None:
    """`nn.Module.compile` on the overlay's submodules, except that each call goes to the compiled code only when the
    run it belongs to was told so (`CompileSwitch.running`), else to the module's own eager call."""
    for name, module in submodules_to_compile(network, settings):
        compiled = torch.compile(module._call_impl, mode=settings.compile_mode,
                                 dynamic=None if name in settings.compile_dynamic else False)

        def call(*args: Any, _compiled=compiled, _eager=module._call_impl, **kwargs: Any) -> Any:
            return (_compiled if switch.compiled_here() else _eager)(*args, **kwargs)

        module._compiled_call_impl = call
