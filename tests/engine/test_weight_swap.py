"""New weights reach the warm, compiled network in place: the output is the new weights' output, nothing recompiles,
the same parameter storage serves them; a state dict that does not fit is refused before anything changes; a swap
waits for the requests that hold the network, and new requests wait behind it."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from rocm_zoo.engine.backend import detect_backend
from rocm_zoo.engine.overlay import OVERLAYS_DIR, OverlaySettings, overlay_path
from rocm_zoo.engine.pool import NetworkPool, NetworkSpec, PoolKey, WarmNetwork, build_network, compiled_graphs
from rocm_zoo.engine.readers_writer import ReadersWriterLock
from rocm_zoo.errors import InvalidRequest
from rocm_zoo.registry import BUNDLES
from rocm_zoo.samples.bundles import write_sample_bundle
from rocm_zoo.samples.bundles.deepedit import NAME as DEEPEDIT, random_weights

ENTRY = BUNDLES[DEEPEDIT]
SHAPE = (1, 3, 64, 64, 32)  # image + two guidance channels; DynUNet strides 32 x 32 x 16 leave a 2^3 bottleneck
WAIT_S = 30.0  # bound on every wait of the thread test; the waits themselves take milliseconds


def toy_network() -> WarmNetwork:
    module = nn.Conv3d(1, 2, 1).eval()
    return WarmNetwork(PoolKey("toy", "cpu", "float32", "contiguous", "eager", False), module, module,
                       detect_backend("cpu"), OverlaySettings(), None, 0.0)


def new_weights(seed: int) -> dict[str, torch.Tensor]:
    return random_weights("tiny", seed)[ENTRY.weights]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny DeepEdit sample through the pool with its overlay (compiled, channels-last, GEMM transpose, bf16
    where this CPU has it), warmed at one shape."""
    bundle = write_sample_bundle(tmp_path_factory.mktemp("model"), DEEPEDIT, "tiny", seed=0)
    spec = NetworkSpec(bundle, ENTRY.config, ENTRY.weights, (overlay_path(OVERLAYS_DIR, DEEPEDIT),), "cpu")
    pool = NetworkPool()
    net = pool.get(spec, [SHAPE])
    assert net.key.compile_mode != "eager", net.backend.fallbacks
    return pool, spec, net


def write_and_swap(pool: NetworkPool, spec: NetworkSpec, state: dict) -> int:
    return pool.swap_weights(spec.bundle_dir, spec.weights, state,
                             lambda: torch.save(state, spec.bundle_dir / spec.weights))


def eager_fp32(spec: NetworkSpec) -> WarmNetwork:
    """A fresh network from the weights file as shipped: no overlay, fp32, eager."""
    return build_network(NetworkSpec(spec.bundle_dir, spec.config, spec.weights, (), "cpu"))


@pytest.mark.slow  # compiles the network (once for the module)
def test_swapped_weights_are_served_by_the_same_compiled_graph(served):
    pool, spec, net = served
    x = torch.rand(SHAPE, generator=torch.Generator().manual_seed(0))
    before = net(x)
    graphs = compiled_graphs()
    storages = {name: t.data_ptr() for name, t in net.eager.state_dict().items()}

    assert write_and_swap(pool, spec, new_weights(seed=7)) == 1
    after = net(x)
    expected = eager_fp32(spec)(x)
    if net.key.dtype == "float32":
        assert torch.allclose(after, expected, atol=1e-4)
    else:  # bf16 keeps ~3 significant digits; logits of this size agree to a few percent (as the overlay test)
        assert ((after - expected).norm() / expected.norm()).item() < 0.05
    assert not torch.allclose(after, before, atol=1e-3), "the old weights are still served"
    assert compiled_graphs() == graphs, "the swap recompiled"
    assert {name: t.data_ptr() for name, t in net.eager.state_dict().items()} == storages
    assert pool.get(spec, [SHAPE]) is net, "the pool rebuilt a network whose new weights were swapped in"


@pytest.mark.slow  # compiles the network (once for the module)
def test_a_wrapped_checkpoint_swaps_like_a_state_dict(served):
    pool, spec, net = served
    state = new_weights(seed=8)
    assert write_and_swap(pool, spec, {"model": state}) == 1
    name = next(iter(state))
    assert torch.equal(net.eager.state_dict()[name].float(), state[name])


@pytest.mark.slow  # compiles the network (once for the module)
def test_weights_that_do_not_fit_are_refused_and_the_served_ones_stay(served):
    pool, spec, net = served
    x = torch.rand(SHAPE, generator=torch.Generator().manual_seed(1))
    before, mtime = net(x), net.weights_mtime
    good = new_weights(seed=9)
    name = next(iter(good))
    missing = {k: v for k, v in good.items() if k != name}
    resized = dict(good, **{name: torch.zeros(3, *good[name].shape[1:])})
    renamed = {f"_orig_mod.{k}": v for k, v in good.items()}  # a compiled module's state dict
    for bad, reason in ((missing, "missing keys"), (resized, "has shape"), (renamed, "unexpected keys")):
        with pytest.raises(InvalidRequest, match=reason):
            pool.swap_weights(spec.bundle_dir, spec.weights, bad, lambda: pytest.fail("wrote the file"))
        with pytest.raises(InvalidRequest, match="served weights are unchanged"):
            net.load_state_in_place(bad)
    assert torch.equal(net(x), before)
    assert net.weights_mtime == mtime
    assert pool.swap_weights(spec.bundle_dir / "elsewhere", spec.weights, good, lambda: None) == 0  # none of it


def test_a_swap_waits_for_the_request_holding_the_network_and_new_requests_wait_for_it():
    net = toy_network()
    new = nn.Conv3d(1, 2, 1).state_dict()
    holding, release, swapped, late_in = threading.Event(), threading.Event(), threading.Event(), threading.Event()

    def request() -> None:
        with net.in_use():
            holding.set()
            release.wait(WAIT_S)

    def late_request() -> None:
        with net.in_use():
            late_in.set()

    def swap() -> None:
        net.load_state_in_place(new)
        swapped.set()

    threads = [threading.Thread(target=request, daemon=True)]
    threads[0].start()
    assert holding.wait(WAIT_S)
    threads.append(threading.Thread(target=swap, daemon=True))
    threads[1].start()
    deadline = time.monotonic() + WAIT_S
    while net._use.writers_waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert net._use.writers_waiting == 1
    threads.append(threading.Thread(target=late_request, daemon=True))
    threads[2].start()
    assert not swapped.wait(0.3), "the swap did not wait for the request"
    assert not late_in.is_set(), "a new request went ahead of the waiting swap"

    release.set()
    assert swapped.wait(WAIT_S) and late_in.wait(WAIT_S)
    assert torch.equal(net.eager.weight, new["weight"])
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive()


def test_a_reader_may_hold_again_while_a_writer_waits():
    lock = ReadersWriterLock()
    wrote = threading.Event()

    def write() -> None:
        with lock.writing():
            wrote.set()

    with lock.reading():
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        deadline = time.monotonic() + WAIT_S
        while lock.writers_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        with lock.reading():  # nested: would wait forever for the writer that waits for this thread
            assert lock.readers == 2
        assert not wrote.is_set()
    assert wrote.wait(WAIT_S)


def test_a_swap_empties_what_was_derived_from_the_old_weights():
    from rocm_zoo.vista3d.predictor import embedding_cache

    net = toy_network()
    cache = embedding_cache(net)
    cache.put(("image", "window"), torch.zeros(4))
    net.load_state_in_place(nn.Conv3d(1, 2, 1).state_dict())
    assert len(cache) == 0
