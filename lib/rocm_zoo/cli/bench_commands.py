"""`rocm-zoo bench*`: the benchmarks."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from rocm_zoo import registry


def _bench_arguments(s: argparse.ArgumentParser, bundle_help: str, out_help: str, repeatable: bool = False) -> None:
    s.add_argument("--bundle-dir", required=True, help=bundle_help, action="append" if repeatable else "store")
    s.add_argument("--overlay", help="overlay file (default: the packaged one, "
                   "rocm_zoo/engine/overlays/<bundle>/inference_rocm.json)")
    s.add_argument("--out", default="bench-out", help=out_help)
    s.add_argument("--runs", type=int, default=20)
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument("--device", default="auto")


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
    from rocm_zoo.registry import APP_DIR
    from rocm_zoo.samples.write import default_paths

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


def add_commands(sub: argparse._SubParsersAction) -> None:

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
