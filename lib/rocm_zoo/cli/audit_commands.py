"""`rocm-zoo audit verify` and `rocm-zoo audit show`: the server's audit trail, read where it lies."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _trail(args: argparse.Namespace):
    from rocm_zoo.registry import APP_DIR
    from rocm_zoo.server.audit.trail import AuditTrail, trail_path

    return AuditTrail(Path(args.file) if args.file else trail_path(Path(args.app or Path.cwd() / APP_DIR)))


def _verify(args: argparse.Namespace) -> int:
    trail = _trail(args)
    if not trail.path.is_file():
        print(f"no audit trail at {trail.path}", file=sys.stderr)
        return 2
    verdict = trail.verify()
    if verdict.intact:
        print(f"intact: {verdict.entries} entries, each following the one before; the last is #{verdict.entries} "
              f"({verdict.last_hash[:16]}), as the head file says")
        return 0
    print(f"NOT INTACT: {trail.path} ({verdict.entries} entries read)", file=sys.stderr)
    for problem in verdict.problems:
        print(f"  {problem}", file=sys.stderr)
    return 1


def _show(args: argparse.Namespace) -> int:
    trail = _trail(args)
    if not trail.path.is_file():
        print(f"no audit trail at {trail.path}", file=sys.stderr)
        return 2
    for entry in trail.entries(user=args.user, image=args.image, since=args.since, event=args.event):
        if args.json:
            print(json.dumps(entry, ensure_ascii=False))
            continue
        actor = entry.get("actor") or {}
        who = actor.get("user") or "-"
        if actor.get("role"):
            who += f" ({actor['role']})"
        details = " ".join(f"{k}={v}" for k, v in (entry.get("details") or {}).items() if k != "conf")
        print(f"{entry.get('seq'):>6}  {entry.get('time')}  {entry.get('event'):<20} {who:<28} "
              f"{actor.get('address') or '-':<15} {details}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("audit", help="the server's audit trail: verify its hash chain, show its entries",
                       description="The server records who logged in (and who failed to), saved, changed or deleted "
                       "labels and images, exported the dataset, trained, swapped or rolled back model weights, "
                       "changed users, and its configuration at each start, in <app>/logs/audit.jsonl: one JSON "
                       "entry per line, each holding the hash of the one before. `verify` recomputes the chain and "
                       "fails (exit 1) on an edited, removed, inserted or reordered entry, or entries removed at the "
                       "end; `show` lists entries (admins also read them at GET /audit/).")
    actions = s.add_subparsers(dest="action", required=True)
    a = actions.add_parser("verify", help="check the hash chain (exit 0 intact, 1 not intact, 2 no trail)")
    a.set_defaults(func=_verify)
    a = actions.add_parser("show", help="list entries, oldest first")
    a.add_argument("--user", help="only entries by this user (a rocm-zoo command's: os:ACCOUNT)")
    a.add_argument("--image", help="only entries naming this image id")
    a.add_argument("--since", help="only entries from this UTC date or time on, e.g. 2026-12-07 or 2026-12-07T09:00")
    a.add_argument("--event", help="only events starting with this, e.g. login, label, weights")
    a.add_argument("--json", action="store_true", help="the entries as JSON lines, as stored")
    a.set_defaults(func=_show)
    for a in actions.choices.values():
        a.add_argument("--app", help="the server's app folder (default apps/rocm_zoo)")
        a.add_argument("--file", help="another audit trail file (default <app>/logs/audit.jsonl)")
