"""`rocm-zoo sample` and `train-sample`: the synthetic phantoms and the sample bundles."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rocm_zoo import registry


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


def add_commands(sub: argparse._SubParsersAction) -> None:

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
