"""rocm_zoo: MONAI Model Zoo bundles behind fast overlays, as a MONAI Label app.

Start:  monailabel start_server --app apps/rocm_zoo --studies <dir> --conf models all   (from a checkout)
        rocm-zoo serve --studies <dir>                                                (any folder; makes the app folder)
MONAI Label loads `<app>/main.py`, which is `app_main.py` of this package (a symlink in a checkout, a copy made by
`rocm-zoo serve` elsewhere): it only imports this class. This module only composes; the engine is the rest of
`rocm_zoo`.
"""

import hashlib
import logging
import os
import sys
import time
from pathlib import Path

from monailabel.config import settings
from monailabel.interfaces.app import MONAILabelApp
from monailabel.tasks.activelearning.first import First

from rocm_zoo import __version__
from rocm_zoo.app.zoo import Zoo
from rocm_zoo.dicomweb import proxy as dicom_proxy
from rocm_zoo.dicomweb.local_series import LocalDicomWeb
from rocm_zoo.dicomweb.pacs_http import PacsTimeouts
from rocm_zoo.engine import streams
from rocm_zoo.engine.scheduler import Priority
from rocm_zoo.engine.volume_check import VolumeBudget, check_volume, set_budget
from rocm_zoo.errors import InvalidRequest, ModelNotFound
from rocm_zoo.server import auth
from rocm_zoo.server.annotation import train_routes
from rocm_zoo.server.annotation.provenance import WeightsVersions, WorkLog
from rocm_zoo.server.annotation.random_strategy import RandomStrategy
from rocm_zoo.server.annotation.trainers import Training
from rocm_zoo.server.annotation.uncertainty import UncertaintyStrategy
from rocm_zoo.server.audit import routes as audit_routes
from rocm_zoo.server.audit.trail import AuditTrail, process_actor, trail_path
from rocm_zoo.server.batch import routes as batch_routes
from rocm_zoo.server.batch.runs import PROTECTED_TAGS, BatchRunner, InProcessEngine, save_study_label, select_images
from rocm_zoo.server.http import access, answers, gpu_log, request_stages, routes
from rocm_zoo.server.http import errors as http_errors
from rocm_zoo.server.http.request_queue import RequestService
from rocm_zoo.server.store import upload_routes, uploads
from rocm_zoo.server.store.datastore import CheckedLocalDatastore

logger = logging.getLogger(__name__)

# Requests of a class that run at once: their host parts (reading, encoding) overlap; their device parts take turns.
# Automatic requests one at a time: each holds a whole preprocessed volume (and its output) in device memory.
INTERACTIVE_AT_ONCE = 2
AUTOMATIC_AT_ONCE = 1


class MyApp(MONAILabelApp):
    def __init__(self, app_dir, studies, conf):
        self.zoo = Zoo(app_dir, conf)
        self.trail = AuditTrail(trail_path(app_dir)) if self.zoo.config.audit else None
        set_budget(VolumeBudget(self.zoo.config.max_volume_voxels, int(self.zoo.config.max_volume_gb * 1e9)))
        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name="rocm_zoo",
            description="MONAI Model Zoo bundles with bf16, channels-last and torch.compile overlays (ROCm, CUDA, CPU)",
            version=__version__,
        )

    def init_infers(self):
        return dict(self.zoo.tasks)

    def init_trainers(self):
        # Trainings run in this process (MONAI Label's would rebuild the app in a subprocess), at the device
        # scheduler's lowest class, on the serving device unless --conf train_device says otherwise.
        self.training = Training(self.zoo.pool, self.datastore, self.zoo.config.train_device or self.zoo.backend.device,
                                 self.trail)
        for task in self.zoo.tasks.values():
            if task.entry.model not in self.training.trainers:
                self.training.add(task.entry.model, Path(task.bundle_path), task.bundle_entry.weights,
                                  self._labels_of(task.entry.name), task.entry.interactive)
        return dict(self.training.trainers)

    def init_strategies(self):
        strategies = {"random": RandomStrategy(), "first": First()}
        conf = self.zoo.config
        # The configured model, else the first automatic segmentation model served.
        model = conf.uncertainty_model or next(
            (name for name, task in self.zoo.tasks.items() if task.entry.kind == "segmentation"), "")
        if model in self.zoo.tasks:
            strategies["uncertainty"] = UncertaintyStrategy(
                self.zoo.tasks[model], conf.uncertainty_flips, conf.uncertainty_max_new,
                requests_running=lambda: hasattr(self, "request_service") and self.request_service.running())
        else:
            logger.warning("rocm_zoo: no /activelearning/uncertainty: %s", self.zoo.missing.get(
                model, "no automatic segmentation model is served"))
        return strategies

    def init_datastore(self):
        if self.studies.startswith(("http://", "https://")):
            # A DICOMweb PACS; labels go back to it as DICOM SEG named after the model's labels.
            from rocm_zoo.dicomweb import store as dicomweb_store

            conf = self.zoo.config
            return dicomweb_store.from_url(self.studies, labels_of=self._labels_of, cache_gb=conf.dicom_cache_gb,
                                           timeouts=PacsTimeouts(conf.pacs_connect_timeout_s, conf.pacs_read_timeout_s))
        return CheckedLocalDatastore(
            self.studies,
            extensions=settings.MONAI_LABEL_DATASTORE_FILE_EXT,
            auto_reload=settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD,
            read_only=settings.MONAI_LABEL_DATASTORE_READ_ONLY,
        )

    def _local_dicomweb(self) -> LocalDicomWeb | None:
        """OHIF's DICOMweb reads answered from a studies folder (none for a PACS: the proxy passes them on)."""
        if self.studies.startswith(("http://", "https://")):
            return None
        folder = hashlib.sha256(os.path.realpath(self.studies).encode()).hexdigest()[:16]
        return LocalDicomWeb(lambda: self.datastore().list_images(), lambda i: self.datastore().get_image_uri(i),
                             Path(self.app_dir) / "cache" / "dicomweb" / folder)

    def on_init_complete(self):
        # Runs once, in the server process, before it answers: batch/train subprocesses never compile.
        if "monailabel.app" in sys.modules:
            web = sys.modules["monailabel.app"].app
            http_errors.install(web)
            conf = self.zoo.config
            streams.set_interactive_stream(conf.interactive_stream)
            sys.setswitchinterval(conf.switch_interval_ms / 1000)
            self.request_service = RequestService(
                conf.request_timeout_s,
                running={Priority.INTERACTIVE: INTERACTIVE_AT_ONCE, Priority.AUTOMATIC: AUTOMATIC_AT_ONCE},
                waiting={Priority.INTERACTIVE: conf.max_queued_clicks, Priority.AUTOMATIC: conf.max_queued_requests})
            self.work_log = WorkLog(WeightsVersions(self._bundle_of))  # for each saved label's provenance
            routes.install(web, self.request_service, self._task_type, self.zoo.readiness, self.work_log.inferred)
            dicom_proxy.install(web, self.studies, PacsTimeouts(conf.pacs_connect_timeout_s, conf.pacs_read_timeout_s),
                                self._local_dicomweb())
            uploads.install_body_limit(web, self.zoo.config.max_upload_mb)
            auth.restrict_cors(web, self.zoo.config.cors_origins)
            auth.install_label_route(web, self.work_log.stamp)
            upload_routes.install(web)  # sessions unpacked safely; dataset zips removed once sent
            # Batch inference in this process, with the warm models (MONAI Label's would start a new process), or on
            # Ray workers with `--conf batch_engine ray`.
            self.batch_runner = BatchRunner(self._batch_engine(), lambda s: select_images(self.datastore(), s),
                                            check_ids=lambda ids: access.check_ids(ids, self.datastore()))
            batch_routes.install(web, self.batch_runner, lambda: list(self._infers))
            train_routes.install(web, self.training)
            if self.trail is not None:
                audit_routes.install(web, self.trail)
            else:
                logger.warning("rocm_zoo: --conf audit false: nothing is recorded in the audit trail")
            # Log in beyond loopback (local users or Keycloak); after every route of ours exists, so roles apply.
            self.auth_mode = auth.install(web, self.zoo.config, self.app_dir, self.trail)
            self._audit_start()
            gpu_log.install(web)  # GET /logs/gpu on a server without nvidia-smi
            # Last, over every route: no JSON answer names a server path (studies files by their names in the folder).
            answers.install(web, lambda: (self.studies, self.app_dir))
        if self.zoo.config.warmup:
            self.zoo.warm()
        super().on_init_complete()

    def _audit_start(self) -> None:
        if self.trail is None:
            return
        from dataclasses import asdict

        conf = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.zoo.config).items()}
        self.trail.record("server.started", process_actor("server"),
                          version=__version__, auth=self.auth_mode, hosts=list(auth.bind_hosts()), conf=conf,
                          studies="DICOMweb PACS" if self.studies.startswith(("http://", "https://")) else "folder")

    def _bundle_of(self, model: str) -> tuple[Path, str] | None:
        task = self.zoo.tasks.get(model)
        return None if task is None else (Path(task.bundle_path), task.bundle_entry.weights)

    def _task_type(self, model: str) -> str:
        """The model's MONAI Label type; an unknown model is refused here, before its request waits in any queue."""
        self._check_model(model)
        return self._infers[model].type

    def _check_model(self, model: str) -> None:
        if model not in self._infers:
            known = ", ".join(self._infers)
            why = self.zoo.missing.get(model, f"Known models: {known}")
            raise ModelNotFound(f"There is no model '{model}'. {why}")

    def _labels_of(self, model: str) -> dict:
        labels = getattr(self._infers.get(model), "labels", None) or {}
        return labels if isinstance(labels, dict) else {name: i for i, name in enumerate(labels, start=1)}

    def _save_label(self, image_id, label_file, tag, model, params):
        return save_study_label(self.datastore(), image_id, label_file, tag, model, params)

    def _batch_engine(self):
        conf = self.zoo.config
        if conf.batch_engine == "ray":
            from rocm_zoo.scale.ray_batch import server_engine

            return server_engine(conf, self.zoo.model_dir, self.zoo.overlays_dir, self.datastore)
        return InProcessEngine(self.infer, self._save_label, self.request_service.running)

    def infer(self, request, datastore=None):
        model = request.get("model")
        self._check_model(model)
        image = request.get("image")
        store = datastore or self.datastore()
        if request.get("save_label") and request.get("label_tag", "original") in PROTECTED_TAGS:
            raise InvalidRequest("A model's label is never saved under 'final' (the tag of labels people saved); "
                                 "use another label_tag")
        start = time.perf_counter()
        with request_stages.recording() as stages:  # fetch series, convert, encode SEG, store: timed by the store
            # A datastore id (or a series of the PACS), never a server path unless allow_local_paths.
            access.check_image(image, store, self.zoo.config.allow_local_paths, self._session_dirs())
            for key in ("image", "label"):  # a file uploaded with the request: header first, within the budget
                if access.is_upload_temp(str(request.get(key) or "")):
                    check_volume(request[key], f"uploaded {key}")
            result = super().infer(request, datastore)
        request_stages.report(result, stages, time.perf_counter() - start, model, str(image))
        return result

    def _session_dirs(self) -> list[str]:
        sessions = self.sessions()
        return [getattr(sessions, "store_path", "")] if sessions else []

    def info(self):
        meta = super().info()
        meta["rocm_zoo"] = self.zoo.info()
        if hasattr(self, "request_service"):
            meta["rocm_zoo"]["requests"] = self.request_service.info()
        return meta
