"""The near-miss hint of every "unknown name" error: `--conf` keys and models, overlay keys, batch models, VISTA3D
labels. Torch-free, so the registry and the configuration may import it."""

from __future__ import annotations

import difflib
from typing import Iterable


def did_you_mean(name: str, known: Iterable[str], otherwise: str = "") -> str:
    """" Did you mean 'x'?" (with its leading space) for the closest of `known` to `name`, as difflib ranks them;
    `otherwise` when none is close."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean '{near[0]}'?" if near else otherwise
