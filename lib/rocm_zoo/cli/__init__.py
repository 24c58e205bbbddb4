"""`rocm-zoo`: a thin shell over the package's public functions."""

from __future__ import annotations

import argparse
import logging

from rocm_zoo.cli import audit_commands, bench_commands, sample_commands, serve_commands


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rocm-zoo", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)
    for commands in (sample_commands, serve_commands, audit_commands, bench_commands):
        commands.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.command == "sample" else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    return args.func(args)

