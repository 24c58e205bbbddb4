"""A bundle's own MONAI Label inference, run fast: network from the warm pool, image cached on the device.

Everything MONAI Label's `BundleInferTask` does is kept (the bundle's own pre/post transforms, inferer, labels,
writer); what changes is where the work runs and what is reused:
- the config is the bundle's merged with its overlay;
- the network comes from the `NetworkPool` (weights loaded strictly, then layout, then compile, warmed);
- the leading image-only transforms (load, channel, orientation, spacing, intensity) run once per image file and
  their result is kept on the device, so later clicks start from there;
- no `torch.cuda.empty_cache()` after each request (it costs a click its latency);
- the mask is written from one compact uint8 copy (DeviceLabelWriter), not MONAI Label's float copy + host transpose.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from monai.transforms import EnsureChannelFirstd, EnsureTyped, LoadImaged
from monai.transforms.utils import reset_ops_id
from monailabel.interfaces.utils.transform import run_transforms
from monailabel.tasks.infer.bundle import BundleInferTask
from monailabel.transform.pre import LoadImageTensord

from rocm_zoo.engine import streams
from rocm_zoo.engine.backend import is_out_of_memory, normalise_device
from rocm_zoo.engine.image_cache import IMAGE_ONLY_TRANSFORMS, ImageCache, file_identity, split_image_only
from rocm_zoo.engine.overlay import BUNDLE_IMPORT_LOCK, load_config
from rocm_zoo.engine.pool import NetworkPool, NetworkSpec, compiled_graphs
from rocm_zoo.engine.scheduler import Priority, current_work
from rocm_zoo.engine.volume_check import first_line
from rocm_zoo.engine.warm_volume import DEFAULT_GRID, WarmGrid, WarmVolume, make_warm_volume
from rocm_zoo.errors import ConfigError, ImageNotFound, InvalidRequest, VolumeTooLarge
from rocm_zoo.registry import BUNDLES, Request, TaskEntry
from rocm_zoo.server.store.label_writer import DeviceLabelWriter

logger = logging.getLogger(__name__)

# The leading transforms that read the file and shape it as a tensor: they run on the host, everything after them on
# the task's device.
HOST_TRANSFORMS = (LoadImaged, LoadImageTensord, EnsureChannelFirstd, EnsureTyped)

class OverlayBundleTask(BundleInferTask):
    # Leading transforms whose output depends on the image alone: run once per image file, then cached.
    cacheable_transforms: tuple[type, ...] = IMAGE_ONLY_TRANSFORMS
    # Interactive tasks keep the preprocessed image for the next click; an automatic task segments an image once,
    # so caching it would only hold device memory (a whole-body CT at 1.5 mm is ~100 MB).
    cache_preprocessed: bool = True
    # The grid of the volume the warm-up requests run on.
    warm_grid: WarmGrid = DEFAULT_GRID

    def __init__(
        self,
        entry: TaskEntry,
        bundle_dir: Path,
        overlays: tuple[Path, ...],
        pool: NetworkPool,
        image_cache: ImageCache,
        device: str = "auto",
    ):
        self.entry = entry
        self.bundle_entry = BUNDLES[entry.bundle]
        self.overlays = overlays
        self.pool = pool
        self.image_cache = image_cache
        self.device = normalise_device(device)
        # False while a background warm-up will compile this task's network: requests then run it eager meanwhile
        # rather than compile it themselves or wait for the compiler.
        self.compile_in_requests = True
        super().__init__(str(bundle_dir), conf={}, type=entry.kind, load_strict=True)
        self._config["device"] = self.device

    def __call__(self, request, callbacks=None):
        # A click's GPU work, pre- and post-processing included, on its thread's high-priority stream (engine.streams).
        with streams.for_work(self.device, interactive=current_work().priority == Priority.INTERACTIVE):
            return super().__call__(request, callbacks)

    # -- config and network ------------------------------------------------------------------------------------------
    def _load_bundle_config(self, path, config):
        return load_config(Path(path), self.bundle_entry.config, self.overlays)

    def network_spec(self) -> NetworkSpec:
        b = self.bundle_entry
        return NetworkSpec(Path(self.bundle_path), b.config, b.weights, self.overlays, self.device)

    def warm_shapes(self) -> list[tuple[int, ...]]:
        """The exact network inputs requests will produce. Subclasses say how the bundle defines them."""
        raise NotImplementedError

    @functools.cached_property
    def _shapes(self) -> list[tuple[int, ...]]:
        return self.warm_shapes()  # parsed from the bundle config once, not on every request

    def warm(self) -> float:
        """Compile and warm the network, then run the bundle's warm-up requests end to end on a small synthetic
        volume, so the first real click finds every reader, transform and writer already initialised (ITK alone takes
        seconds to load its IO). Both as one build of the network: other threads' requests run it eager meanwhile,
        and the warm-up requests compile what their prompts need (VISTA3D's heads) before any request runs it."""
        try:
            net = self.pool.get(self.network_spec())  # built; compiled below, inside the build
            with net.switch.building():
                network_seconds = self.pool.get(self.network_spec(), self._shapes).warm_seconds
                start = time.perf_counter()
                volume = make_warm_volume(self.warm_grid)
                requests = self.warm_requests(volume)
                with tempfile.TemporaryDirectory(prefix="rocm_zoo_warm_") as tmp:
                    image = os.path.join(tmp, "warmup.nii.gz")
                    volume.write(Path(image))
                    for request in requests:
                        result, _ = self({"image": image, "result_extension": ".nrrd", "result_dtype": "uint8",
                                          **request})
                        if result and os.path.exists(result):
                            os.remove(result)
        finally:
            self.compile_in_requests = True
        logger.info("%s: %d warm-up request(s) end to end in %.1f s", self.entry.name, len(requests),
                    time.perf_counter() - start)
        return network_seconds

    def encode(self, request: Request, volume: WarmVolume) -> Optional[Dict[str, Any]]:
        """The request's parameters as this task's viewers send them; None where they cannot ask it."""
        return {} if request.kind == "whole_volume" else None

    def warm_requests(self, volume: WarmVolume) -> list[Dict[str, Any]]:
        """The registry's warm-up requests for the bundle that this task's viewers can send."""
        encoded = [self.encode(r, volume) for r in self.bundle_entry.requests if r.warm]
        requests = [e for e in encoded if e is not None]
        if not requests:
            raise ConfigError(f"{self.entry.name} (type {self.entry.kind}) can send none of the warm-up requests of "
                              f"{self.entry.bundle}: {', '.join(r.name for r in self.bundle_entry.requests)}")
        return requests

    # MONAI Label instantiates the bundle's transforms and inferer per request with the bundle's `scripts` on
    # sys.path; one bundle at a time, since a background warm-up may be doing the same for another bundle.
    def pre_transforms(self, data=None):
        with BUNDLE_IMPORT_LOCK:
            return super().pre_transforms(data)

    def inferer(self, data=None):
        with BUNDLE_IMPORT_LOCK:
            return super().inferer(data)

    def post_transforms(self, data=None):
        with BUNDLE_IMPORT_LOCK:
            return super().post_transforms(data)

    def _get_network(self, device, data):
        # Always the task's configured device: a per-request device would mean a network nobody warmed.
        return self.pool.get(self.network_spec(), self._shapes, compile=self.compile_in_requests)

    def run_inferer(self, data: Dict[str, Any], convert_to_batch=True, device="cuda"):
        network = self._get_network(device, data)
        inputs = data[self.input_key]
        inputs = inputs if torch.is_tensor(inputs) else torch.from_numpy(inputs)
        inferer = self.inferer(data)
        with network.in_use():  # every window of the request on one set of weights (a swap waits for it)
            outputs = inferer(inputs[None] if convert_to_batch else inputs, network)
        data[self.output_label_key] = outputs[0] if convert_to_batch else outputs
        return data

    # -- pre transforms with the per-image cache ---------------------------------------------------------------------
    def run_pre_transforms(self, data: Dict[str, Any], transforms):
        head, tail = split_image_only(transforms, self.cacheable_transforms + (LoadImageTensord,))
        image = data.get(self.input_key)
        if not isinstance(image, str) or not head:
            return super().run_pre_transforms(data, transforms)
        if not image or not os.path.isfile(image):
            raise ImageNotFound(f"Image file '{os.path.basename(str(image))}' does not exist (removed from the "
                                "datastore?)")

        def load() -> dict:
            # The file is read on the host; orientation, resampling and intensity scaling then run where the network
            # runs, so the volume crosses to the device once, as read, and the heavy steps run there.
            on_host, on_device = split_image_only(head, HOST_TRANSFORMS)
            try:
                loaded = run_transforms({self.input_key: image}, on_host, log_prefix="PRE", use_compose=False)
            except Exception as e:  # a corrupt or unsupported file: say so, the server keeps serving
                raise InvalidRequest(f"Image '{os.path.basename(image)}' cannot be read: {first_line(e)}") from e
            try:
                loaded[self.input_key] = loaded[self.input_key].to(self.device)
                if on_device:
                    loaded = run_transforms(loaded, on_device, log_prefix="PRE", use_compose=False)
            except Exception as e:  # e.g. a header whose geometry the resampling cannot use
                if is_out_of_memory(e):
                    raise VolumeTooLarge(f"Image '{os.path.basename(image)}' does not fit on {self.device} for "
                                         f"{self.entry.name}'s preprocessing: {first_line(e)}") from e
                raise InvalidRequest(f"Image '{os.path.basename(image)}' cannot be preprocessed for "
                                     f"{self.entry.name}: {first_line(e)}") from e
            loaded.pop("latencies", None)  # a cache hit reports only the transforms it ran
            # The inverse of each traced transform checks it is undone by the very object that did it; a cached
            # image outlives those objects (every request, and every task of this bundle, parses its own), so the
            # trace is marked as MONAI allows for transforms recreated in other processes: match by class. Nested
            # entries too (a crop that also padded keeps its pad inside the crop's entry).
            reset_ops_id(loaded[self.input_key])
            return loaded

        # Batch and background work (a batch, the uncertainty ranking) reads every study once: it uses an image a
        # clinician has open, but keeping its own would push those out.
        keep = current_work().priority < Priority.BATCH
        cached = self.image_cache.get_or_make(self.image_cache_key(image), load, keep) if self.cache_preprocessed \
            else load()
        data.update(cached)
        self.prepare_request(data)
        return run_transforms(data, tail, log_prefix="PRE", use_compose=False) if tail else data

    def image_cache_key(self, image: str) -> tuple:
        """Which preprocessed image a file gives: the file as it is now, through this bundle, overlays and device."""
        return (file_identity(image), self.bundle_path, tuple(map(str, self.overlays)), self.device)

    def prepare_request(self, data: Dict[str, Any]) -> None:
        """Check (and normalise) request parameters against the loaded image; raise InvalidRequest with the reason."""

    def writer(self, data: Dict[str, Any], extension=None, dtype=None):
        if extension is not None:
            data["result_extension"] = extension
        if dtype is not None:
            data["result_dtype"] = dtype
        if self.labels is not None:
            data["labels"] = self.labels
        return DeviceLabelWriter(label=self.output_label_key, json=self.output_json_key)(data)

    # -- what /info shows -------------------------------------------------------------------------------------------
    def info(self) -> Dict[str, Any]:
        i = super().info()
        i["bundle"] = self.entry.bundle
        i["overlays"] = [str(o) for o in self.overlays]
        net = self.pool.peek(self.network_spec())
        i.update(net.info() if net else {"device": self.device, "warm": False})
        i["compiled_graphs"] = compiled_graphs()
        i["image_cache"] = {"hits": self.image_cache.hits, "misses": self.image_cache.misses}
        return i
