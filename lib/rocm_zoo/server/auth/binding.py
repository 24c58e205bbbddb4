"""Which addresses the server listens on, and the log-in mode that follows from them.

MONAI Label's `start_server` parses `--host` with argparse, which keeps the last one given (and accepts `-i H`, `-iH`,
`--host=H` and unambiguous prefixes such as `--ho H`); uvicorn binds that one. Log-in is decided from every host the
command line names, so `--host 127.0.0.1 --host 0.0.0.0` counts as listening beyond loopback.
"""

from __future__ import annotations

import ipaddress
import sys

MONAILABEL_DEFAULT_HOST = "0.0.0.0"  # `monailabel start_server` without --host
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
_LONG = "--host"
_LONG_MIN_PREFIX = "--ho"  # shorter ("--h") is ambiguous with --help, so argparse refuses it


def _long_option(arg: str) -> tuple[bool, str | None]:
    """(names --host, the attached value if `=VALUE`)."""
    name, eq, value = arg.partition("=")
    if len(name) >= len(_LONG_MIN_PREFIX) and _LONG.startswith(name):
        return True, value if eq else None
    return False, None


def bind_hosts(argv: list[str] | None = None) -> list[str]:
    """Every host the command line names (in order), else MONAI Label's default 0.0.0.0."""
    argv = list(sys.argv if argv is None else argv)
    hosts = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        is_host, value = _long_option(arg) if arg.startswith("--") else (False, None)
        if is_host:
            if value is None and i + 1 < len(argv):
                value = argv[i + 1]
                i += 1
            if value is not None:
                hosts.append(value)
        elif arg == "-i" and i + 1 < len(argv):
            hosts.append(argv[i + 1])
            i += 1
        elif arg.startswith("-i") and not arg.startswith("--"):
            hosts.append(arg[2:].lstrip("="))
        i += 1
    return hosts or [MONAILABEL_DEFAULT_HOST]


def bind_host(argv: list[str] | None = None) -> str:
    """The host uvicorn binds: the last one given (argparse's rule)."""
    return bind_hosts(argv)[-1]


def is_loopback(host: str) -> bool:
    host = (host or "").strip().lower().rstrip(".")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def all_loopback(hosts: list[str]) -> bool:
    return bool(hosts) and all(is_loopback(h) for h in hosts)


def decide(conf_auth: str, hosts: str | list[str], keycloak: bool) -> str:
    """keycloak, local or off: `auto` is on as soon as any bound host is beyond loopback."""
    hosts = [hosts] if isinstance(hosts, str) else list(hosts)
    if keycloak:
        return "keycloak"
    if conf_auth == "on" or (conf_auth == "auto" and not all_loopback(hosts)):
        return "local"
    return "off"
