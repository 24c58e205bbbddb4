"""One warm network per (bundle, device, dtype, layout, compile mode), shared by every task that uses it.

A network is built once: bundle config + overlay parsed, weights loaded strictly, layout applied, compiled, then run
at the exact shapes it will see, so compilation never happens inside a request. It is rebuilt when its weights file
changes, unless the new weights were swapped into it in place (`NetworkPool.swap_weights`: same parameter storage,
so the compiled graphs stay valid and nothing recompiles). The pool is thread-safe: a second caller asking for a
network that is still warming waits for it instead of compiling a second copy, unless it asks for the network as it
is (`compile=False`, the server's requests while its background warm-up runs): then it gets it at once and runs it
eager, with the same weights, layout and autocast, until the compiled graphs are built (`CompileSwitch`).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from rocm_zoo.engine.backend import Backend, detect_backend, normalise_device
from rocm_zoo.engine.compile_switch import CompileSwitch, switchable_submodules
from rocm_zoo.engine.overlay import AMP_DTYPES, MEMORY_FORMATS, OverlaySettings, bundle_on_path, load_config, load_weights
from rocm_zoo.engine.overlay import prepare_network, read_settings, unwrap_state_dict
from rocm_zoo.engine.readers_writer import ReadersWriterLock
from rocm_zoo.engine.scheduler import current_work, device_turn, waiting_for_lower_work
from rocm_zoo.errors import InvalidRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetworkSpec:
    """Where a network comes from: the bundle config with `overlays` merged over it in order. No overlays is the
    bundle as shipped (the fp32 eager baseline)."""

    bundle_dir: Path
    config: str
    weights: str
    overlays: tuple[Path, ...] = ()
    device: str = "auto"


@dataclass(frozen=True)
class PoolKey:
    bundle: str
    device: str
    dtype: str
    memory_format: str
    compile_mode: str  # "eager" when not compiled
    gemm_transpose: bool


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process. Flat after warm-up means no request recompiled."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def in_layout(x: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """`x` dense in `memory_format`, with the strides a new tensor of that format has, so a compiled network sees one
    layout. `contiguous()` keeps the stride of a size-1 dimension as it finds it, and Dynamo guards on that stride
    too: a one-channel click window sliced from the image and one padded to the window compiled VISTA3D's encoder
    twice, the second time on a clinician's first click (10 s on the H200)."""
    strides = torch.empty(x.shape, device="meta", memory_format=memory_format).stride()
    if x.stride() == strides:
        return x
    if x.is_contiguous(memory_format=memory_format):  # the same bytes: only the unused strides differ
        return x.as_strided(x.shape, strides)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=memory_format).copy_(x)


@dataclass
class WarmNetwork:
    key: PoolKey
    eager: nn.Module  # the loaded, layout-optimised module (its submodules compiled in place when the overlay says so)
    runner: Any  # what requests call: torch.compile(eager), or eager itself
    backend: Backend
    settings: OverlaySettings
    weights_path: Path
    weights_mtime: float
    warm_seconds: float = 0.0
    warmed_shapes: list[tuple[int, ...]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _use: ReadersWriterLock = field(default_factory=ReadersWriterLock, repr=False)
    # The tensors a swap writes, by the bundle's state-dict keys, as built: a task may later wrap submodules (VISTA3D's
    # cached ones), which renames the module's own keys but not the checkpoint's.
    _state: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _after_swap: list[Callable[[], None]] = field(default_factory=list, repr=False)
    switch: CompileSwitch = field(default_factory=CompileSwitch, repr=False)

    def __post_init__(self) -> None:
        if not self._state:
            self._state = dict(self.eager.state_dict(keep_vars=True))

    @property
    def dtype(self) -> torch.dtype:
        return AMP_DTYPES[self.key.dtype]

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run on a batch, in the device scheduler's turn; returns float32 outputs on the device. MetaTensors go in as
        plain tensors so the compiled graph sees one input type. A batch smaller than a warmed one of the same window
        (a sliding window's last batch) is padded to it, so it runs the compiled graph instead of compiling another;
        extra arguments (prompts) go to the network as they are."""
        return self._run(x, args, kwargs, turn=True)

    @property
    def compiled(self) -> bool:
        return self.key.compile_mode != "eager"

    def _runs_compiled(self, shape: tuple[int, ...]) -> bool:
        if not self.compiled or self.switch.building_here():
            return self.compiled
        if self.switch.building_elsewhere():
            return False
        if self.runner is self.eager:  # compiled submodules: warm once built
            return self.switch.built
        return shape in self.warmed_shapes

    def compile_state(self) -> str:
        """What a request runs now: `eager` (compile off, or not built yet), `compiling` (built meanwhile; requests run
        eager) or `compiled`."""
        if not self.compiled or not (self.switch.built or self.switch.building_elsewhere()):
            return "eager"
        return "compiling" if self.switch.building_elsewhere() else "compiled"

    def _run(self, x: torch.Tensor, args: tuple, kwargs: dict, turn: bool) -> torch.Tensor:
        x = x.as_tensor() if hasattr(x, "as_tensor") else x
        x = x.to(self.backend.device, dtype=torch.float32)
        n = x.shape[0]
        full = self.padded_batch(tuple(x.shape)) if not (args or kwargs) else n
        compiled = self._runs_compiled((full, *x.shape[1:]))
        if not compiled:
            full = n  # eager takes any batch
        if full > n:
            x = torch.cat([x, x.new_zeros((full - n, *x.shape[1:]))])
        x = in_layout(x, MEMORY_FORMATS[self.key.memory_format])
        # No autocast weight cache (served parameters need no grad, so there is nothing to cache anyway): PyTorch's
        # cache is process-wide, and one thread clearing it at autocast exit (decref under its mutex, then waiting for
        # the GIL) deadlocked with another tracing a compile under autocast (holding the GIL, waiting for the mutex).
        autocast = (
            torch.autocast(self.backend.device.split(":")[0], dtype=self.dtype, cache_enabled=False)
            if self.dtype != torch.float32
            else nullcontext()
        )
        runner = self.runner if compiled else self.eager
        # Requests' runs one at a time (the compiled code's own state, CUDA graphs); the building thread's take no lock,
        # so a request runs eager while that thread compiles.
        run_lock = nullcontext() if self.switch.building_here() else self._lock
        with device_turn(self.backend.device) if turn else nullcontext(), run_lock, self.switch.running(compiled), \
                torch.no_grad(), autocast:
            y = runner(x, *args, **kwargs)
        return y[:n].float() if full > n else y.float()

    @contextmanager
    def in_use(self) -> Iterator[WarmNetwork]:
        """Held by a request around its whole inference (many at once), so it runs on one set of weights from its
        first window to its last; a weight swap waits until no request holds it. Get the network from the pool
        first: a request waiting here must not hold anything the swap needs."""
        # A swap may wait for a batch study holding the network, which steps aside while requests are in progress.
        with self._use.reading(check=lambda: current_work().check(), waiting=waiting_for_lower_work):
            yield self

    def load_state_in_place(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy new weights into the served tensors: same storage, dtype and memory format, so the compiled graphs
        (and CUDA graphs) stay valid. Checked strictly first (same keys and shapes as the bundle's checkpoint;
        `InvalidRequest` otherwise, nothing changed); then waits until no request holds the network, blocking new
        ones meanwhile. Call it outside a turn on the device: a request it waits for may be waiting for that turn."""
        state = unwrap_state_dict(state_dict)
        check_state_dict(state, self._state, str(self.key.bundle))
        with self._use.writing(), torch.no_grad():
            cuda = self.backend.device.startswith("cuda")
            if cuda:  # the last request's kernels may still be reading the old weights on another stream
                torch.cuda.synchronize(self.backend.device)
            for name, target in self._state.items():
                target.copy_(state[name])
            if cuda:
                torch.cuda.synchronize(self.backend.device)
            for hook in self._after_swap:
                hook()

    def after_swap(self, hook: Callable[[], None]) -> None:
        """Run `hook` after each in-place swap, while requests still wait: for what was derived from the old weights
        (VISTA3D's encoder outputs)."""
        self._after_swap.append(hook)

    def __getattr__(self, name: str) -> Any:
        """Bundle inferers read attributes of the network they are given (VISTA3D's reads `point_head`): the
        module's own attributes are visible through the warm wrapper."""
        if name.startswith("__") or name in ("eager", "runner"):
            raise AttributeError(name)
        return getattr(self.eager, name)

    def padded_batch(self, shape: tuple[int, ...]) -> int:
        """The batch size to run `shape` at: its own if warmed, else the smallest warmed larger batch of that window."""
        if shape in self.warmed_shapes:
            return shape[0]
        larger = [s[0] for s in self.warmed_shapes if s[1:] == shape[1:] and s[0] > shape[0]]
        return min(larger, default=shape[0])

    def warm(self, shapes: Sequence[Sequence[int]]) -> float:
        """Compile and run at each exact input shape; returns the seconds it took."""
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(0)
        with self.switch.building():
            for shape in shapes:
                x = torch.rand(tuple(shape), generator=gen)
                # The first call compiles: host work, outside the device's turns, so clicks go on meanwhile. The
                # second still meets one-time set-up (algorithm search) and runs as the scheduler's background work.
                self._run(x, (), {}, turn=False)
                self(x)
                self.warmed_shapes.append(tuple(shape))
        if self.backend.device.startswith("cuda"):
            torch.cuda.synchronize(self.backend.device)
        self.warm_seconds = round(time.perf_counter() - start, 2)
        return self.warm_seconds

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.backend.kind,
            "device": self.backend.device,
            "device_name": self.backend.device_name,
            "dtype": self.key.dtype,
            "memory_format": self.key.memory_format,
            "compiled": self.compiled,
            "compile_mode": self.key.compile_mode,
            "compile_state": self.compile_state(),
            "gemm_transpose": self.key.gemm_transpose,
            "cudnn_benchmark": self.settings.cudnn_benchmark,
            "warm": bool(self.warmed_shapes),
            "warmed_shapes": [list(s) for s in self.warmed_shapes],
            "warmup_seconds": self.warm_seconds,
            "fallbacks": list(self.backend.fallbacks),
        }


def build_network(spec: NetworkSpec) -> WarmNetwork:
    """Parse config + overlay, load weights strictly, then layout, then compile (in that order, always)."""
    parser = load_config(spec.bundle_dir, spec.config, spec.overlays)
    settings = read_settings(parser)
    backend = detect_backend(
        spec.device, want_bf16=settings.amp_dtype != "float32", want_compile=settings.compile
    )
    dtype = settings.amp_dtype if backend.bf16 else "float32"
    if backend.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    with bundle_on_path(spec.bundle_dir):
        network = parser.get_parsed_content("network_def", instantiate=True)
    weights = Path(spec.bundle_dir) / spec.weights
    load_weights(network, weights)
    network = prepare_network(network.eval(), settings, backend.device).requires_grad_(False)
    compile_mode = (settings.compile_mode or "default") if backend.compile else "eager"
    switch = CompileSwitch()
    if not backend.compile:
        runner = network
    elif settings.compile_submodules is None:
        runner = torch.compile(network, mode=settings.compile_mode, dynamic=False)
    else:
        switchable_submodules(network, settings, switch)
        runner = network
    key = PoolKey(
        bundle=Path(spec.bundle_dir).name,
        device=backend.device,
        dtype=dtype,
        memory_format=settings.memory_format,
        compile_mode=compile_mode,
        gemm_transpose=settings.gemm_transpose,
    )
    return WarmNetwork(key, network, runner, backend, settings, weights, weights.stat().st_mtime, switch=switch)


def check_state_dict(state: Mapping[str, Any], expected: Mapping[str, torch.Tensor], what: str) -> None:
    """`state` has exactly the keys of `expected`, tensors of the same shapes and kinds (floating or not)."""
    if not isinstance(state, Mapping):
        raise InvalidRequest(f"New weights for {what}: expected a state dict, got {type(state).__name__}")
    problems = []
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        problems.append(f"missing keys {_some(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_some(unexpected)}")
    for name, target in expected.items():
        new = state.get(name)
        if name not in state:
            continue
        if not torch.is_tensor(new):
            problems.append(f"{name} is a {type(new).__name__}, not a tensor")
        elif new.shape != target.shape:
            problems.append(f"{name} has shape {list(new.shape)}, the network's is {list(target.shape)}")
        elif new.is_floating_point() != target.is_floating_point():
            problems.append(f"{name} is {new.dtype}, the network's is {target.dtype}")
    if problems:
        raise InvalidRequest(f"New weights for {what} do not fit its network (the served weights are unchanged): "
                             + "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))


def _some(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" (and {len(names) - n} more)" if len(names) > n else "")


class NetworkPool:
    def __init__(self) -> None:
        self._nets: dict[NetworkSpec, WarmNetwork] = {}
        self._locks: dict[NetworkSpec, threading.Lock] = {}
        self._guard = threading.Lock()

    @staticmethod
    def _normalised(spec: NetworkSpec) -> NetworkSpec:
        return NetworkSpec(spec.bundle_dir, spec.config, spec.weights, spec.overlays, normalise_device(spec.device))

    def peek(self, spec: NetworkSpec) -> WarmNetwork | None:
        """The network if it is built already; never builds."""
        return self._nets.get(self._normalised(spec))

    def get(self, spec: NetworkSpec, warm_shapes: Sequence[Sequence[int]] = (), compile: bool = True) -> WarmNetwork:
        """The network, built if it is not, and compiled and warmed at `warm_shapes` unless `compile` is False: then a
        network that is built is returned as it is, at once, even while another thread compiles it (the caller runs it
        eager until it is warm; see `CompileSwitch`)."""
        spec = self._normalised(spec)
        if not compile and (net := self._current(spec)) is not None:
            return net
        with self._guard:
            lock = self._locks.setdefault(spec, threading.Lock())
        if not lock.acquire(blocking=False):  # held while building: a concurrent caller waits instead of compiling
            with waiting_for_lower_work():  # the builder may be the background warm-up, which steps aside for requests
                while not lock.acquire(timeout=0.1):
                    current_work().check()  # a second copy; a request that is given up meanwhile stops waiting
                    if not compile and (net := self._current(spec)) is not None:
                        return net  # built; the holder compiles it now
        try:
            net = self._current(spec)
            if net is None:
                if spec in self._nets:
                    logger.info("%s: weights file changed; reloading", Path(spec.bundle_dir) / spec.weights)
                net = build_network(spec)
                self._nets[spec] = net
            missing = [tuple(s) for s in warm_shapes if tuple(s) not in net.warmed_shapes]
            if missing and compile:
                seconds = net.warm(missing)
                logger.info("%s warm in %.1f s at %s", net.key, seconds, missing)
            return net
        finally:
            lock.release()

    def _current(self, spec: NetworkSpec) -> WarmNetwork | None:
        """The built network of `spec` if its weights file is still the one it was built from."""
        net = self._nets.get(spec)
        if net is not None and (Path(spec.bundle_dir) / spec.weights).stat().st_mtime != net.weights_mtime:
            return None
        return net

    def networks(self) -> list[WarmNetwork]:
        return list(self._nets.values())

    def swap_weights(self, bundle_dir: Path, weights_rel: str, state_dict: Mapping[str, torch.Tensor],
                     write_file: Callable[[], None]) -> int:
        """Load `state_dict` in place into every warm network built from this bundle folder and weights file (several
        specs and devices may share it), and have `write_file()` write the new weights file meanwhile: both happen
        while `get` cannot look at the file for these networks, so no request sees the new file with the old weights
        (and rebuilds). Every network is checked before the file is written or any is changed. Returns how many were
        updated; one that is warming now is waited for."""
        folder = Path(bundle_dir).resolve()
        specs = sorted((s for s in list(self._nets) if Path(s.bundle_dir).resolve() == folder
                        and s.weights == weights_rel), key=repr)
        state = unwrap_state_dict(state_dict)
        for spec in specs:
            check_state_dict(state, self._nets[spec]._state, str(self._nets[spec].key))
        with ExitStack() as held:
            for spec in specs:
                held.enter_context(self._locks[spec])  # not while `get` builds, warms or checks the file
            nets = [self._nets[s] for s in specs if s in self._nets]
            write_file()  # first: if it fails, nothing changed; if a copy below failed, `get` rebuilds from the file
            for net in nets:
                net.load_state_in_place(state)
                net.weights_mtime = (Path(bundle_dir) / weights_rel).stat().st_mtime
                logger.info("%s: new weights swapped in place", net.key)
        return len(nets)
