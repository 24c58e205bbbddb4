"""`rocm-zoo serve`, `pacs`, `users`, `models`, `env` and `batch`: running the server and looking after what it serves."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rocm_zoo import registry

if TYPE_CHECKING:
    from rocm_zoo.training.checkpoints import CheckpointStore


def _serve(args: argparse.Namespace) -> int:
    from rocm_zoo.app.app_folder import make_app_folder
    from rocm_zoo.registry import APP_DIR
    from rocm_zoo.samples.write import default_paths

    if importlib.util.find_spec("monailabel") is None:
        print("monailabel is not installed here: pip install 'rocm-zoo[server]'", file=sys.stderr)
        return 2
    app = make_app_folder(Path(args.app or Path.cwd() / APP_DIR))
    # This interpreter (the one that has rocm_zoo and monailabel) runs what the `monailabel` launcher would run.
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", str(app),
           "--studies", str(args.studies or default_paths().studies), "--host", args.host, "--port", str(args.port),
           "--conf", "models", args.models]
    for kv in args.conf or []:
        cmd += ["--conf", *kv]
    if args.ssl_certfile or args.ssl_keyfile:  # MONAI Label hands these to uvicorn: HTTPS
        if not (args.ssl_certfile and args.ssl_keyfile):
            print("HTTPS needs both --ssl-certfile and --ssl-keyfile", file=sys.stderr)
            return 2
        cmd += ["--ssl_certfile", args.ssl_certfile, "--ssl_keyfile", args.ssl_keyfile]
    print(" ".join(cmd), flush=True)
    os.execve(sys.executable, cmd, dict(os.environ, MONAILABEL_PYEXE=sys.executable))
    return 0


def _pacs(args: argparse.Namespace) -> int:
    if args.action == "push":
        return _pacs_push(args)
    from rocm_zoo.bench import pacs

    config = pacs.PacsConfig(folder=Path(args.folder or Path.cwd() / ".pacs"), http_port=args.port)
    proc = pacs.start(config)
    server = None
    try:
        for folder in map(Path, args.load or []):
            files = sorted(folder.rglob("*.dcm"))
            if not files:
                raise pacs.PacsError(f"no .dcm files under {folder}")
            series = pacs.upload(config, files)
            print(f"loaded {len(files)} files ({len(series)} series) from {folder}", flush=True)
        print(f"PACS: {config.url} (DICOMweb {config.dicomweb_url}; storage {config.folder / 'storage'})", flush=True)
        server = None
        if args.serve:
            serve = [sys.executable, "-m", "rocm_zoo.cli", "serve", "--studies", config.dicomweb_url,
                     "--host", args.host, "--port", str(args.server_port), "--models", args.models]
            for kv in args.conf or []:
                serve += ["--conf", *kv]
            server = subprocess.Popen(serve)
        # SIGTERM as well as Ctrl-C stops the server and then Orthanc (the `finally` below).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        return (server or proc).wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            pacs.stop(server, timeout=30)
        pacs.stop(proc)


def _pacs_push(args: argparse.Namespace) -> int:
    from rocm_zoo.dicomweb import store

    url = args.studies or f"http://127.0.0.1:{args.port}/dicom-web"
    results = store.push(url, args.cache)
    for r in results:
        state = f"stored as SEG series {r['SeriesInstanceUID']}" if r["ok"] else f"still pending: {r['reason']}"
        print(f"{r['image_id']} ({r['tag']}): {state}", flush=True)
    if not results:
        print(f"no pending labels for {url} (in {store.pending_folder(url, args.cache)})")
    return 1 if any(not r["ok"] for r in results) else 0


def _users(args: argparse.Namespace) -> int:
    import getpass

    from rocm_zoo.errors import InvalidRequest
    from rocm_zoo.registry import APP_DIR
    from rocm_zoo.server.auth import users_path
    from rocm_zoo.server.auth.users import UserFile

    app_dir = Path(args.app or Path.cwd() / APP_DIR)
    path = users_path(args.users_file or "", app_dir)
    users = UserFile(path)
    try:
        if args.action == "list":
            for u in users.list():
                print(f"{u.name}\t{u.role}")
            return 0
        if not args.name:
            print(f"rocm-zoo users {args.action} needs a NAME", file=sys.stderr)
            return 2
        if args.action in ("remove", "revoke"):
            act, done = {"remove": (users.remove, f"removed {args.name} (their tokens stop working at once)"),
                         "revoke": (users.revoke, f"{args.name}'s tokens stop working at once (the password stays; "
                                                  "they log in again)")}[args.action]
            if not act(args.name):
                print(f"no user '{args.name}' in {path}", file=sys.stderr)
                return 1
            _audit(app_dir, {"remove": "user.removed", "revoke": "user.revoked"}[args.action], "rocm-zoo users",
                   name=args.name)
            print(done)
            return 0
        if not args.role:
            print("rocm-zoo users add needs --role annotator|reviewer|admin", file=sys.stderr)
            return 2
        if args.password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass(f"password for {args.name}: ")
            if getpass.getpass("again: ") != password:
                print("the passwords differ", file=sys.stderr)
                return 2
        existed = users.get(args.name) is not None
        user = users.add(args.name, args.role, password, replace=args.replace)
    except InvalidRequest as e:
        print(str(e), file=sys.stderr)
        return 2
    _audit(app_dir, "user.changed" if existed else "user.added", "rocm-zoo users", name=user.name, role=user.role)
    print(f"{user.name} ({user.role}) in {path}" + (" (tokens issued before stop working)" if args.replace else ""))
    return 0


def _models(args: argparse.Namespace) -> int:
    from rocm_zoo.errors import RocmZooError
    from rocm_zoo.samples.write import default_paths
    from rocm_zoo.training.checkpoints import CheckpointStore

    model_dir = Path(args.model_dir or default_paths().model_dir)
    names = [args.bundle] if args.bundle else [n for n in registry.BUNDLES if (model_dir / n).is_dir()]
    for name in names:
        if name not in registry.BUNDLES:
            print(f"no bundle '{name}'; rocm_zoo serves: {', '.join(registry.BUNDLES)}", file=sys.stderr)
            return 2
        if not (model_dir / name).is_dir():
            print(f"{name} is not in {model_dir}", file=sys.stderr)
            return 2
    if not names:
        print(f"no bundles in {model_dir}")
        return 0
    stores = {n: CheckpointStore(model_dir / n, registry.BUNDLES[n].weights) for n in names}
    if args.action == "list":
        for store in stores.values():
            print(_checkpoint_table(store))
        return 0
    store = stores[args.bundle]
    try:
        entry = store.rollback(args.checkpoint)
    except RocmZooError as e:
        print(str(e), file=sys.stderr)
        return 1
    _audit(model_dir.parent, "weights.rolled_back", "rocm-zoo models", model=args.bundle, checkpoint=entry.id,
           rollback_of=entry.rollback_of)
    score = "not measured" if entry.score is None else f"score {entry.score:.3f}"
    print(f"{args.bundle}: now serving checkpoint {entry.rollback_of} ({score}) as {store.weights}, recorded as "
          f"checkpoint {entry.id}. A running server picks it up at its next request for this model: the pool "
          "reloads a network whose weights file changed (that request waits for the reload and compile).")
    return 0


def _audit(app_dir: Path, event: str, command: str, **details) -> None:
    """One entry in the app's audit trail, by this machine's account (the server may be running: the trail takes
    writers from several processes)."""
    from rocm_zoo.server.audit.trail import AuditTrail, process_actor, trail_path

    if not app_dir.is_dir():
        print(f"warning: not recorded in an audit trail: no app folder {app_dir} (name the server's with --app)",
              file=sys.stderr)
        return
    try:
        AuditTrail(trail_path(app_dir)).record(event, process_actor(command), **details)
    except OSError as e:
        print(f"warning: not recorded in the audit trail ({trail_path(app_dir)}): {e}", file=sys.stderr)


def _checkpoint_table(store: CheckpointStore) -> str:
    checkpoints = store.list()
    if not checkpoints:
        return f"{store.name}: no checkpoints kept (serving the bundle's own {store.weights.name})"
    served = store.served()
    lines = [f"{store.name} ({store.folder}):", "    id         created                    score  source         epochs  "
             "labels  measured on"]
    for c in checkpoints:
        mark = "*" if served is not None and c.id == served.id else " "
        score = "-" if c.score is None else f"{c.score:.3f}"
        source = c.source if c.rollback_of is None else f"rollback of {c.rollback_of}"
        epochs, labels = ("-" if n is None else str(n) for n in (c.epochs, c.labels))
        lines.append(f"  {mark} {c.id:<10} {c.created:<26} {score:>5}  {source:<13} {epochs:>6}  {labels:>6}  "
                     f"{c.measured_on or '-'}")
    if served is None:
        lines.append("  (the weights file holds none of these: it was replaced from outside)")
    else:
        lines.append(f"  * served as {store.weights.name}")
    return "\n".join(lines)


def _env(args: argparse.Namespace) -> int:
    from rocm_zoo.engine.backend import describe, detect_backend, env_defaults

    backend = detect_backend(args.device)
    print(describe(backend))
    for k, v in env_defaults(backend).items():
        print(f"export {k}={v}")
    return 0


def _batch(args: argparse.Namespace) -> int:
    from rocm_zoo.engine.overlay import OVERLAYS_DIR
    from rocm_zoo.errors import RocmZooError
    from rocm_zoo.samples.write import default_paths
    from rocm_zoo.scale.ray_batch import progress_line, run_batch, summary

    studies = Path(args.studies or default_paths().studies)
    report = Path(args.report) if args.report else studies / "batch-reports" / f"{args.model}-{args.tag}.json"

    def show(run, outcome) -> None:
        failed = "" if outcome.ok else f" FAILED: {outcome.reason}"
        print(f"{progress_line(run)} | {outcome.image}{failed}", flush=True)

    try:
        record = run_batch(model=args.model, studies=studies, selection=args.images, image_ids=args.image,
                           tag=args.tag, address=args.address, workers=args.workers, max_retries=args.max_retries,
                           restarts=args.worker_restarts, device=args.device,
                           model_dir=Path(args.model_dir or default_paths().model_dir), overlays_dir=OVERLAYS_DIR,
                           extra_overlays=tuple(map(Path, args.overlay or ())), report=report, on_outcome=show)
    except RocmZooError as e:
        print(f"rocm-zoo batch: {e}", file=sys.stderr)
        return 2
    print(summary(record))
    print(f"report: {report}")
    return 1 if record["failed"] else 0


def add_commands(sub: argparse._SubParsersAction) -> None:

    s = sub.add_parser("serve", help="start the MONAI Label server with the rocm_zoo app")
    s.add_argument("--studies", help="datastore folder (default sample-data/studies)")
    s.add_argument("--app", help="MONAI Label app folder: logs and, in model/, the bundles (default apps/rocm_zoo; "
                   "made, with its main.py, if missing)")
    s.add_argument("--models", default="all",
                   help=f"'all' or a comma list of models: {', '.join(registry.MODELS)} (default all)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--conf", nargs=2, action="append", metavar=("KEY", "VALUE"), help="more app --conf options")
    s.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM) ...")
    s.add_argument("--ssl-keyfile", help="... and this private key (PEM)")
    s.set_defaults(func=_serve)


    s = sub.add_parser("pacs", help="start a local Orthanc PACS (DICOMweb on 127.0.0.1), load DICOM series into it "
                       "and, with --serve, the MONAI Label server against it; Ctrl-C stops both. `pacs push`: store "
                       "the labels the PACS did not take (kept pending by the server) now")
    s.add_argument("action", nargs="?", choices=["start", "push"], default="start",
                   help="start (default): the local PACS; push: the server's pending labels for --studies, as SEG")
    s.add_argument("--studies", help="push: the PACS's DICOMweb URL, as given to the server (default the local "
                   "PACS on --port)")
    s.add_argument("--cache", help="push: the server's MONAI_LABEL_DICOMWEB_CACHE_PATH, if it set one")
    s.add_argument("--folder", help="Orthanc's settings, storage and log (default .pacs)")
    s.add_argument("--port", type=int, default=8042, help="Orthanc HTTP port (default 8042)")
    s.add_argument("--load", action="append", metavar="DIR", help="store every .dcm under DIR, repeatable")
    s.add_argument("--serve", action="store_true", help="then run `rocm-zoo serve` with the PACS as its datastore")
    s.add_argument("--models", default="all")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--server-port", type=int, default=8000)
    s.add_argument("--conf", nargs=2, action="append", metavar=("KEY", "VALUE"), help="more app --conf options")
    s.set_defaults(func=_pacs)


    s = sub.add_parser("users", help="the server's local users (log-in beyond loopback): add, list, remove, revoke",
                       description="Users for the server's own log-in (MONAI Label's /auth/token flow, used when the "
                       "server listens beyond loopback or with --conf auth on). Passwords are stored as scrypt "
                       "hashes in <app>/users.json (mode 0600). Roles: annotator (infer, save labels), reviewer "
                       "(also 'final' labels), admin (also train, batch, delete). A password change (add --replace), "
                       "revoke or remove ends the user's tokens at once.")
    s.add_argument("action", choices=["add", "list", "remove", "revoke"])
    s.add_argument("name", nargs="?")
    s.add_argument("--role", choices=["annotator", "reviewer", "admin"])
    s.add_argument("--app", help="the server's app folder (default apps/rocm_zoo)")
    s.add_argument("--users-file", help="another user file (the server's --conf users_file)")
    s.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    s.add_argument("--replace", action="store_true", help="add: change an existing user's password and role")
    s.set_defaults(func=_users)


    s = sub.add_parser("models", help="the checkpoints kept for each bundle (training's, the shipped weights, "
                       "rollbacks): list them, or serve a kept one again",
                       description="Every checkpoint that training accepted is kept under "
                       "<bundle>/models/checkpoints/ (with the bundle's shipped weights, kept before the first one), "
                       "with its date, validation score (mean Dice) and source. `list` shows them, * marking the one "
                       "the bundle's weights file serves; `rollback BUNDLE ID` makes checkpoint ID the served "
                       "weights file again (atomically) and records the rollback. A running server picks the "
                       "weights up at its next request for that model (it reloads a network whose weights file "
                       "changed).")
    # One parser per action, so options may come before or after the positionals (`list --model-dir DIR BUNDLE`).
    actions = s.add_subparsers(dest="action", required=True)
    a = actions.add_parser("list", help="the checkpoints of BUNDLE (default: every bundle in the model folder)")
    a.add_argument("bundle", nargs="?", metavar="BUNDLE", help="bundle folder name, e.g. spleen_deepedit_annotation")
    a.set_defaults(checkpoint=None)
    a = actions.add_parser("rollback", help="serve checkpoint ID of BUNDLE again")
    a.add_argument("bundle", metavar="BUNDLE", help="bundle folder name, e.g. spleen_deepedit_annotation")
    a.add_argument("checkpoint", metavar="ID", help="the checkpoint to serve (an id from `models list`)")
    for a in actions.choices.values():
        a.add_argument("--model-dir", help="the bundles' folder (default apps/rocm_zoo/model; a rollback is recorded "
                       "in the audit trail of the app folder above it)")
        a.set_defaults(func=_models)


    s = sub.add_parser("env", help="print the detected backend and the environment it wants")
    s.add_argument("--device", default="auto")
    s.set_defaults(func=_env)


    s = sub.add_parser(
        "batch", help="segment a studies folder with a batch model on Ray workers (every GPU, or several hosts)",
        description="Segments the studies of a datastore folder (NIfTI/NRRD files, as `rocm-zoo serve --studies` "
        "uses it) with one warm worker per GPU, as Ray actors, and writes labels as the server's batch does: "
        "<studies>/labels/<tag>/, atomically, never under 'final'. This process reads the studies and writes the "
        "labels; workers on other hosts need only the same Python environment and the bundle at the same path. "
        "A worker that dies loses no study: its studies run again on another worker (at most --max-retries times), "
        "Ray restarts the worker (--worker-restarts) or it is dropped. Exit status 1 if any study failed.")
    s.add_argument("--model", required=True, help=f"batch model: {', '.join(registry.batch_models())}")
    s.add_argument("--studies", help="datastore folder of the studies (default sample-data/studies)")
    s.add_argument("--images", default="unlabeled", choices=["all", "labeled", "unlabeled"],
                   help="which studies of the folder: unlabeled (no label under any tag; default), labeled, all")
    s.add_argument("--image", action="append", metavar="ID", help="only this study id (file name without extension); "
                   "repeatable, replaces --images")
    s.add_argument("--address", help="join this Ray cluster (e.g. HEAD:6379 or 'auto'); without it a local Ray "
                   "is started on 127.0.0.1, dashboard off, and stopped at the end")
    s.add_argument("--workers", type=int, default=0, help="workers: default one per GPU of the cluster, or one on a "
                   "machine without GPUs; CPU workers split the cores between them")
    s.add_argument("--max-retries", type=int, default=2, help="times a study whose worker died runs again on another "
                   "(default 2); a study that fails with an ordinary error is reported, not retried")
    s.add_argument("--worker-restarts", type=int, default=1, help="times Ray restarts a worker whose process died "
                   "before it is dropped (default 1)")
    s.add_argument("--tag", default="original", help="label tag to write (default original; 'final' is refused)")
    s.add_argument("--report", help="per-study JSON report (default <studies>/batch-reports/<model>-<tag>.json)")
    s.add_argument("--device", default="auto", help="auto (GPU workers if the cluster has GPUs), cuda, or cpu")
    s.add_argument("--model-dir", help="bundle folder, the same path on every host (default apps/rocm_zoo/model)")
    s.add_argument("--overlay", action="append", metavar="JSON", help="extra overlay merged last, e.g. a file with "
                   '{"rocm_overlay#compile": false} for eager workers; repeatable')
    s.set_defaults(func=_batch)
