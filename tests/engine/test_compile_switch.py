"""Eager until compiled: while one thread compiles and warms a network, every other thread runs it eager at once
(same result, no wait, no compile of its own); afterwards the warmed shapes run compiled and any other shape eager,
so no request ever compiles. Real torch.compile on CPU."""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

from rocm_zoo.engine.backend import detect_backend
from rocm_zoo.engine.compile_switch import CompileSwitch, switchable_submodules
from rocm_zoo.engine.fx_threads import isolate_fx_tracing_patches
from rocm_zoo.engine.overlay import OverlaySettings
from rocm_zoo.engine.pool import PoolKey, WarmNetwork, compiled_graphs

SHAPE = (2, 1, 8, 8, 8)


def conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.InstanceNorm3d(4), nn.Conv3d(4, 2, 1)).eval()


def whole_network_compiled() -> WarmNetwork:
    net = conv()
    key = PoolKey("toy", "cpu", "float32", "contiguous", "default", False)
    return WarmNetwork(key, net, torch.compile(net, dynamic=False), detect_backend("cpu"), OverlaySettings(), None,
                       0.0)


def test_while_another_thread_compiles_a_run_is_eager_and_does_not_wait():
    net = whole_network_compiled()
    x = torch.rand(SHAPE)
    assert net.compile_state() == "eager"
    compiling, done = threading.Event(), threading.Event()
    eager_runs_during_the_build = []

    def build():
        with net.switch.building():
            compiling.set()
            net.warm([SHAPE])  # the real compile, in this thread
        done.set()

    threading.Thread(target=build, daemon=True).start()
    assert compiling.wait(30)
    graphs = compiled_graphs()
    while not done.is_set():
        start = time.perf_counter()
        during = net.switch.building_elsewhere()
        y = net(x)
        if during and net.switch.building_elsewhere():  # the whole run fell inside the build
            eager_runs_during_the_build.append(time.perf_counter() - start)
            assert net.compile_state() == "compiling"
            assert torch.allclose(y, net.eager(x), atol=1e-5)
        time.sleep(0.01)
    assert eager_runs_during_the_build, "the build ended before any run could overlap it"
    assert compiled_graphs() - graphs <= 1, "only the building thread compiles"
    print(f"\n{len(eager_runs_during_the_build)} eager runs during the compile, the longest "
          f"{max(eager_runs_during_the_build) * 1000:.0f} ms")

    # Built: the warmed shape runs the compiled graph; another shape runs eager rather than compile a graph.
    graphs = compiled_graphs()
    assert net.compile_state() == "compiled"
    assert torch.allclose(net(x), net.eager(x), atol=1e-5)
    other = torch.rand(2, 1, 8, 8, 6)
    assert torch.allclose(net(other), net.eager(other), atol=1e-5)
    assert compiled_graphs() == graphs, "a run after the build compiled a graph"


def test_compiled_submodules_follow_the_run_they_belong_to():
    outer = nn.Sequential(conv(), nn.ReLU()).eval()
    switch = CompileSwitch()
    settings = OverlaySettings(compile=True, compile_submodules=("0",))
    switchable_submodules(outer, settings, switch)
    x = torch.rand(SHAPE)
    with torch.no_grad():
        expected = outer[1](outer[0]._call_impl(x))
        graphs = compiled_graphs()
        with switch.running(False):
            assert torch.allclose(outer(x), expected, atol=1e-5)
        assert compiled_graphs() == graphs, "an eager run compiled the submodule"
        with switch.building(), switch.running(True):
            assert torch.allclose(outer(x), expected, atol=1e-5)
        assert compiled_graphs() > graphs, "the building run did not compile the submodule"
        assert switch.built and not switch.building_elsewhere()


def test_a_module_run_while_another_thread_fx_traces_runs_as_itself():
    # torch.fx patches nn.Module.__call__ for the whole process while it traces (Inductor does, for every kernel it
    # generates); without rocm_zoo.engine.fx_threads this run fails with "module is not installed as a submodule".
    isolate_fx_tracing_patches()
    inside, leave = threading.Event(), threading.Event()

    def traced(x):
        inside.set()
        leave.wait(30)
        return x + 1

    tracer = threading.Thread(target=lambda: torch.fx.symbolic_trace(traced), daemon=True)
    tracer.start()
    try:
        assert inside.wait(30)
        net, x = conv(), torch.rand(SHAPE)
        with torch.no_grad():
            assert net(x).shape == (2, 2, 8, 8, 8)
    finally:
        leave.set()
        tracer.join(30)
    assert not tracer.is_alive()
