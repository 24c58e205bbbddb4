"""`rocm-zoo`: a thin shell over the package's public functions."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rocm_zoo import registry

if TYPE_CHECKING:
    from rocm_zoo.training.checkpoints import CheckpointStore

def _sample(args: argparse.Namespace) -> int:
    from rocm_zoo.samples.write import SamplePaths, default_paths, make_samples

    d = default_paths()
    paths = SamplePaths(
        studies=Path(args.studies or d.studies), truth=Path(args.truth or d.truth), model_dir=Path(args.model_dir or d.model_dir)
    )
    make_samples(paths, size=args.size, spleen10=not args.no_spleen10, train=args.train, train_steps=args.train_steps,
                 bundles=tuple(args.bundle) if args.bundle else None, dicom=Path(args.dicom) if args.dicom else None)
    print(f"studies: {paths.studies}\ntruth:   {paths.truth}\nbundles: {paths.model_dir}")
    if args.dicom:
        print(f"DICOM:   {args.dicom}")
    return 0


def _train_sample(args: argparse.Namespace) -> int:
    from rocm_zoo.engine.backend import normalise_device
    from rocm_zoo.samples.train_sample import save_trained_weights, train_sample, trained_weights_file
    from rocm_zoo.samples.write import installed

    out = Path(args.out)
    weights, record = train_sample(args.bundle, Path(args.work) if args.work else out / "work", args.phantoms,
                                   args.epochs, normalise_device(args.device), args.minutes, args.val_interval,
                                   args.workers, args.seed, args.resume)
    record["command"] = " ".join(["rocm-zoo", *sys.argv[1:]])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"train_sample_{args.bundle}.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: record[k] for k in ("bundle", "state", "reason", "epochs_run", "seconds")}, indent=2))
    if weights is None:
        start = "the committed weights" if args.resume else "its random start"
        print(f"no weights kept: the training did not validate better than {start}", file=sys.stderr)
        return 1
    print(f"weights: {save_trained_weights(args.bundle, weights, record, out)}")
    if not installed(trained_weights_file(args.bundle)):  # an installed package is not edited
        print(f"weights: {save_trained_weights(args.bundle, weights, record)}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rocm_zoo.app.app_folder import make_app_folder
    from rocm_zoo.samples.write import APP_DIR, default_paths

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
    from rocm_zoo.samples.write import APP_DIR
    from rocm_zoo.server.auth import users_path
    from rocm_zoo.server.auth.users import UserFile

    path = users_path(args.users_file or "", Path(args.app or Path.cwd() / APP_DIR))
    users = UserFile(path)
    try:
        if args.action == "list":
            for u in users.list():
                print(f"{u.name}\t{u.role}")
            return 0
        if not args.name:
            print(f"rocm-zoo users {args.action} needs a NAME", file=sys.stderr)
            return 2
        if args.action == "remove":
            if not users.remove(args.name):
                print(f"no user '{args.name}' in {path}", file=sys.stderr)
                return 1
            print(f"removed {args.name} (their tokens stop working at once)")
            return 0
        if args.action == "revoke":
            if not users.revoke(args.name):
                print(f"no user '{args.name}' in {path}", file=sys.stderr)
                return 1
            print(f"{args.name}'s tokens stop working at once (the password stays; they log in again)")
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
        user = users.add(args.name, args.role, password, replace=args.replace)
    except InvalidRequest as e:
        print(str(e), file=sys.stderr)
        return 2
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
    score = "not measured" if entry.score is None else f"score {entry.score:.3f}"
    print(f"{args.bundle}: now serving checkpoint {entry.rollback_of} ({score}) as {store.weights}, recorded as "
          f"checkpoint {entry.id}. A running server picks it up at its next request for this model: the pool "
          "reloads a network whose weights file changed (that request waits for the reload and compile).")
    return 0


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


def _bench(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.network import run_bench

    if args.overlay and len(args.bundle_dir) > 1:
        raise SystemExit("rocm-zoo bench: --overlay names one bundle's overlay; give one --bundle-dir with it")
    command = " ".join(["rocm-zoo", *sys.argv[1:]])
    extra = {}
    for spec in args.variant or []:
        name, _, keys = spec.partition("=")
        try:
            extra[name.strip()] = json.loads(keys)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--variant {spec!r}: expected NAME={{JSON of overlay keys}} ({e})") from e
    for bundle_dir in map(Path, args.bundle_dir):
        run_bench(bundle_dir=bundle_dir, overlay=Path(args.overlay) if args.overlay else None,
                  out_dir=Path(args.out) / bundle_dir.resolve().name, runs=args.runs, warmup=args.warmup,
                  device=args.device, compile_modes=args.compile_mode, sw_batch_sizes=args.sw_batch_size,
                  extra_variants=extra, command=command)
    return 0


def _bench_click(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.click import run_click_bench

    run_click_bench(bundle_dir=Path(args.bundle_dir), overlay=Path(args.overlay) if args.overlay else None,
                    out_dir=Path(args.out), runs=args.runs, warmup=args.warmup, device=args.device)
    return 0


def _bench_warmup(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.warmup import run_warmup_bench

    shapes = [[int(n) for n in s.split("x")] for s in args.shape]
    run_warmup_bench(bundle_dir=Path(args.bundle_dir), shapes=shapes, out_dir=Path(args.out), device=args.device,
                     restarts=args.restarts, cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                     command=" ".join(["rocm-zoo", *sys.argv[1:]]))
    return 0


def _bench_batch(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.batch import run_batch_bench, write_phantoms

    images = [Path(i) for i in args.image or []] + write_phantoms(args.phantom or [], Path(args.out) / "studies")
    if not images:
        raise SystemExit("rocm-zoo bench-batch: give --image FILE or --phantom NAME (at least one study)")
    run_batch_bench(bundle_dirs=[Path(b) for b in args.bundle_dir], images=images, out_dir=Path(args.out),
                    repeats=args.repeats, device=args.device, paths=tuple(args.path or ("stock", "rocm_zoo")),
                    command=" ".join(["rocm-zoo", *sys.argv[1:]]))
    return 0


def _bench_train(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.train import run as run_train_bench
    from rocm_zoo.engine.backend import normalise_device

    record = run_train_bench(Path(args.model_dir), args.bundle, args.phantoms, args.epochs,
                             normalise_device(args.device), Path(args.out), args.click_seconds)
    print(json.dumps({k: v for k, v in record.items() if k in ("bundle", "speedup", "loss_agreement", "clicks")},
                     indent=2))
    return 0


def _bench_ohif(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.ohif import run_ohif_bench

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stops the browser, the server and Orthanc on the way out
    models = {"models": tuple(args.model)} if args.model else {}  # default: run_ohif_bench's
    run_ohif_bench(out_dir=Path(args.out), repeats=args.repeats, **models,
                   work_dir=Path(args.work) if args.work else None, command=" ".join(["rocm-zoo", *sys.argv[1:]]))
    return 0


def _bench_load(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.load import run_load_bench
    from rocm_zoo.bench.load_plan import LoadBenchError
    from rocm_zoo.samples.write import APP_DIR, default_paths

    studies = Path(args.studies) if args.studies else default_paths().studies
    truth = Path(args.truth) if args.truth else studies.parent / "truth"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stops the Locust process and a server started here
    try:
        record = run_load_bench(
            out_dir=Path(args.out), url=args.url, app=Path(args.app) if args.app else Path.cwd() / APP_DIR,
            studies=studies, truth=truth, device=args.device, conf=dict(args.conf or []), deepedit=args.deepedit,
            vista3d=args.vista3d, automatic=args.automatic, automatic_model=args.automatic_model,
            automatic_images=args.automatic_image, bad=args.bad, hostile=args.hostile, monitor=not args.no_monitor,
            batch=args.batch or "", images=args.image, think_time_s=args.think_time, duration_s=args.duration,
            baseline_s=args.baseline_duration if args.baseline else 0.0, request_timeout_s=args.request_timeout,
            command=" ".join(["rocm-zoo", *sys.argv[1:]]))
    except LoadBenchError as e:
        raise SystemExit(f"rocm-zoo bench-load: {e}") from e
    from rocm_zoo.bench.load_report import markdown

    print(markdown(record))
    print(f"record: {Path(args.out) / 'load.json'} (and load.md, load.png, samples.jsonl)")
    return 1 if record["phases"]["mixed"]["error"] else 0


def _bench_report(args: argparse.Namespace) -> int:
    from rocm_zoo.bench.report import ReportError, check_report, write_report

    index, markdown = Path(args.index), Path(args.markdown)
    chart = None if args.no_chart else Path(args.chart)
    try:
        if args.check:
            if not check_report(index=index, markdown=markdown, chart=chart):
                print(f"{markdown}: the current table differs from what {index} and its records make; "
                      "run `rocm-zoo bench-report`", file=sys.stderr)
                return 1
            return 0
        rows = write_report(index=index, markdown=markdown, chart=chart)
    except ReportError as e:
        raise SystemExit(f"rocm-zoo bench-report: {e}") from e
    print(f"{markdown}: {len(rows)} rows" + (f"; {chart}" if chart else ""))
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


def _bench_arguments(s: argparse.ArgumentParser, bundle_help: str, out_help: str, repeatable: bool = False) -> None:
    s.add_argument("--bundle-dir", required=True, help=bundle_help, action="append" if repeatable else "store")
    s.add_argument("--overlay", help="overlay file (default: the packaged one, "
                   "rocm_zoo/engine/overlays/<bundle>/inference_rocm.json)")
    s.add_argument("--out", default="bench-out", help=out_help)
    s.add_argument("--runs", type=int, default=20)
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument("--device", default="auto")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rocm-zoo", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sample", help="write synthetic CT phantoms (NIfTI) and the sample bundles")
    s.add_argument("--size", choices=["tiny", "full"], default="tiny",
                   help="tiny: CPU-sized, phantom-trained weights (default); full: real network size, untrained "
                   "unless --train")
    s.add_argument("--studies", help="datastore folder for the phantoms (default sample-data/studies)")
    s.add_argument("--truth", help="folder for their truth masks (default sample-data/truth)")
    s.add_argument("--model-dir", help="where bundles go (default apps/rocm_zoo/model)")
    s.add_argument("--no-spleen10", action="store_true", help="skip the 512x512x55 spleen_10-shaped phantom")
    s.add_argument("--dicom", metavar="DIR", help="also write each phantom as a CT DICOM series in DIR/<name>/ "
                   "(for a PACS: see `rocm-zoo pacs`)")
    s.add_argument("--bundle", action="append", choices=[n for n, b in registry.BUNDLES.items() if b.sample],
                   help="write only this sample bundle (folder name, e.g. wholeBody_ct_segmentation), repeatable")
    s.add_argument("--train", action="store_true",
                   help="train the DeepEdit weights on phantoms (tiny: ~5 min on 2 CPU cores, replaces the committed "
                   "weights; full: use a GPU)")
    s.add_argument("--train-steps", type=int, default=1000, help="training steps with --train (default 1000)")
    s.set_defaults(func=_sample)

    s = sub.add_parser("train-sample", help="train a tiny sample bundle on phantoms with its own train config (the "
                       "server's training code); its best weights become the sample's committed ones")
    s.add_argument("--bundle", required=True, choices=[n for n, b in registry.BUNDLES.items() if b.sample])
    s.add_argument("--phantoms", type=int, default=16, help="training phantoms; the last two validate (default 16)")
    s.add_argument("--epochs", type=int, default=200, help="at most this many epochs (default 200)")
    s.add_argument("--minutes", type=float, default=8.0, help="or this long, ending with a validated epoch "
                   "(default 8)")
    s.add_argument("--val-interval", type=int, default=10, help="validate every this many epochs (default 10)")
    s.add_argument("--workers", type=int, default=4, help="data loader worker processes (default 4)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--resume", action="store_true", help="start from the committed trained weights instead of "
                   "random ones (kept only if it validates better than they do)")
    s.add_argument("--device", default="auto")
    s.add_argument("--out", default="train-sample-out", help="folder for the record and a copy of the weights")
    s.add_argument("--work", help="folder for the sample bundle and the phantoms (default OUT/work)")
    s.set_defaults(func=_train_sample)

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
        a.add_argument("--model-dir", help="the bundles' folder (default apps/rocm_zoo/model)")
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

    s = sub.add_parser("bench", help="time bundles' network/inferer: fp32 eager baseline vs the overlay, with Dice")
    _bench_arguments(s, "a bundle folder (real or sample); repeatable: one run per bundle",
                     "folder for <bundle>/bench.json, bench.md and bench.png", repeatable=True)
    s.add_argument("--compile-mode", action="append", default=None,
                   help="torch.compile modes to compare, repeatable (default: the overlay's)")
    s.add_argument("--sw-batch-size", action="append", type=int, default=None,
                   help="also time the overlay with this sliding-window batch size, repeatable")
    s.add_argument("--variant", action="append", metavar="NAME=JSON",
                   help='also time the overlay with these config keys merged last, e.g. '
                   '\'eager bf16={"rocm_overlay#compile": false}\', repeatable')
    s.set_defaults(func=_bench)

    s = sub.add_parser("bench-click", help="click-to-mask time in one process: stock DeepEdit path vs rocm_zoo's")
    _bench_arguments(s, "a DeepEdit bundle folder (real or sample)", "folder for click.json")
    s.set_defaults(func=_bench_click)

    s = sub.add_parser("bench-warmup", help="network warm-up time: cold start vs restarts that reuse the compile cache")
    s.add_argument("--bundle-dir", required=True, help="a bundle folder (real or sample)")
    s.add_argument("--shape", action="append", required=True,
                   help="network input to warm, e.g. 4x1x96x96x96 (the task's warmed shape; see /info), repeatable")
    s.add_argument("--out", default="bench-out", help="folder for warmup-<bundle>.json")
    s.add_argument("--device", default="auto")
    s.add_argument("--restarts", type=int, default=2, help="starts after the cold one (default 2)")
    s.add_argument("--cache-dir", help="empty folder for the Inductor cache (default: a new temp folder)")
    s.set_defaults(func=_bench_warmup)

    s = sub.add_parser("bench-batch", help="one study end to end (file to label file): stock MONAI Label vs rocm_zoo "
                       "(needs monailabel)")
    s.add_argument("--bundle-dir", required=True, action="append",
                   help="a sliding-window bundle folder (real or sample); repeatable")
    s.add_argument("--image", action="append", help="a study (NIfTI file); repeatable")
    s.add_argument("--phantom", action="append", choices=["spleen10", "ct512x397"],
                   help="also write and use this synthetic study: spleen10 (512x512x55, 0.98x0.98x5 mm) or "
                   "ct512x397 (512x512x397, 0.78x0.78x1.25 mm); repeatable")
    s.add_argument("--repeats", type=int, default=3, help="runs per study and path (default 3)")
    s.add_argument("--path", action="append", choices=["stock", "rocm_zoo"], help="only these paths (default both)")
    s.add_argument("--out", default="bench-out", help="folder for batch.json, batch.md (and the phantoms)")
    s.add_argument("--device", default="auto")
    s.set_defaults(func=_bench_batch)

    s = sub.add_parser("bench-train", help="a bundle's train config: fp32 eager vs the training overlay (samples/s, "
                       "loss curves), optionally DeepEdit clicks while it trains")
    s.add_argument("--model-dir", required=True, help="folder holding the bundle (and spleen_deepedit_annotation for "
                   "--click-seconds)")
    s.add_argument("--bundle", required=True, choices=sorted(registry.BUNDLES), help="bundle folder name")
    s.add_argument("--phantoms", type=int, default=6, help="phantoms with labels to train on; the last validates "
                   "(default 6)")
    s.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    s.add_argument("--click-seconds", type=float, default=0.0, help="then time DeepEdit clicks for this long alone "
                   "and as long again during a training (default 0: skip)")
    s.add_argument("--out", default="bench-out", help="folder for train_<bundle>.json and the phantoms")
    s.add_argument("--device", default="auto")
    s.set_defaults(func=_bench_train)

    s = sub.add_parser("bench-ohif", help="OHIF 'Run' to segmentation shown, in headless Chromium against a local "
                       "Orthanc, first and repeated, with the server's per-stage split (CPU, tiny sample bundles)")
    s.add_argument("--model", action="append", choices=list(registry.ohif_actions()),
                   help="only this model, repeatable (default: wholeBody_ct's auto segmentation and a VISTA3D spleen "
                   "point)")
    s.add_argument("--repeats", type=int, default=5, help="Runs after the first (default 5)")
    s.add_argument("--out", default="bench-out", help="folder for bench_ohif.json and bench_ohif.md")
    s.add_argument("--work", help="folder for the app copy, DICOM, Orthanc and server logs (default: a temp folder, "
                   "removed afterwards)")
    s.set_defaults(func=_bench_ohif)

    s = sub.add_parser(
        "bench-load", help="load benchmark on Locust: simulated clinicians (DeepEdit, VISTA3D clicks) and automatic "
        "clients against one server; per request kind p50/p90/p99, throughput, errors; JSON, markdown, plot",
        description="Simulated users against one rocm_zoo server on loopback, headless Locust in a child process: "
        "DeepEdit clinicians (3D Slicer clicks) and VISTA3D clinicians (OHIF point prompts), each on its own study "
        "with a think time between clicks; automatic requesters asking a segmentation back to back; optionally "
        "requests the server must refuse (4xx, counted as intended), a batch run over the datastore, and a monitor "
        "polling /info/ and /health/* (404: not available). With --baseline, one user of each class runs alone "
        "first and the mix is reported against it. The server's RSS (and GPU memory, through nvidia-smi) is sampled "
        "throughout. Writes load.json, load.md, load.png and samples.jsonl to --out. Load goes to loopback only and "
        "stops by itself. Exit status 1 if the mixed phase had errors (other than intended 4xx, 503 and 504).")
    s.add_argument("--url", help="a running server on this machine (http://127.0.0.1:PORT; other hosts are refused), "
                   "waited on until every model is warm; without it a server is started here on a free loopback port with the models the mix needs, "
                   "waited on until warm, and stopped at the end")
    s.add_argument("--app", help="app folder for a server started here (default apps/rocm_zoo; bundles in model/)")
    s.add_argument("--studies", help="datastore folder for a server started here (default sample-data/studies)")
    s.add_argument("--truth", help="truth masks <id>.nii.gz the clicks are placed from, inside the spleen (default: "
                   "'truth' beside the studies folder, as `rocm-zoo sample` writes it)")
    s.add_argument("--device", default="auto", help="device of a server started here: auto, cuda, cpu (its "
                   "--conf device)")
    s.add_argument("--conf", nargs=2, action="append", metavar=("KEY", "VALUE"), help="more --conf for a server "
                   "started here")
    s.add_argument("--deepedit", type=int, default=2, help="DeepEdit clinicians, 3D Slicer clicks (default 2)")
    s.add_argument("--vista3d", type=int, default=1, help="VISTA3D clinicians, OHIF point prompts (default 1)")
    s.add_argument("--automatic", type=int, default=1, help="automatic requesters, back to back (default 1)")
    automatic = registry.default_task("segmentation", interactive=False)
    s.add_argument("--automatic-model", default=automatic, help=f"their model (default {automatic})")
    s.add_argument("--automatic-image", action="append", metavar="ID", help="study they segment, repeatable: "
                   "cycled (default: the first study)")
    s.add_argument("--bad", type=int, default=0, help="users sending requests the server must refuse: unknown "
                   "model, click outside the image (default 0)")
    s.add_argument("--hostile", type=int, default=0, help="users sending attacks the server must refuse with a 4xx: "
                   "a session archive slipping out of its folder, decompression-bomb labels, a server path, MONAI "
                   "Label's WSI route as a file oracle, a DNS-rebinding Host header (default 0)")
    s.add_argument("--no-monitor", action="store_true", help="no user polling /info/, /health/live, /health/ready")
    s.add_argument("--batch", metavar="MODEL", help="also run one batch of MODEL over the datastore (images=all; "
                   "labels tag 'original'), started with the mix and stopped at its end")
    s.add_argument("--image", action="append", metavar="ID", help="study clinicians work on, repeatable; each "
                   "clinician takes the next (default: every study with a truth mask)")
    s.add_argument("--think-time", type=float, default=1.0, help="seconds between a clinician's clicks (default 1)")
    s.add_argument("--duration", type=float, default=60.0, help="seconds of the mixed load (default 60)")
    s.add_argument("--baseline", action="store_true", help="first run one user of each class alone (the baseline "
                   "the mix's ratios are against)")
    s.add_argument("--baseline-duration", type=float, default=20.0, help="seconds of each baseline phase "
                   "(default 20)")
    s.add_argument("--request-timeout", type=float, default=300.0, help="seconds before a request counts as not "
                   "answered (default 300)")
    s.add_argument("--out", default="bench-out/load", help="folder for load.json, load.md, load.png, samples.jsonl, "
                   "the Locust logs and a started server's log (default bench-out/load)")
    s.set_defaults(func=_bench_load)

    s = sub.add_parser("bench-report", help="the current benchmark table (in docs/benchmarks.md) and chart, made "
                       "from the JSON records that docs/benchmarks/current.json names")
    s.add_argument("--index", default="docs/benchmarks/current.json", help="rows: record, JSON path, target, date")
    s.add_argument("--markdown", default="docs/benchmarks.md", help="the file whose table between the markers is "
                   "rewritten")
    s.add_argument("--chart", default="docs/benchmarks/current.png", help="the chart PNG (baseline, today, target)")
    s.add_argument("--no-chart", action="store_true", help="only the table")
    s.add_argument("--check", action="store_true", help="write nothing; exit 1 if the table is not what the records "
                   "make")
    s.set_defaults(func=_bench_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.command == "sample" else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
