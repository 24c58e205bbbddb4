"""FX tracing kept to the thread that traces.

torch.fx's symbolic tracing replaces `nn.Module.__call__` and `nn.Module.__getattr__` for the whole process while it
traces, and Inductor traces small functions that way while it generates every kernel (`LoopBody`'s bounds). A module
called meanwhile from another thread enters that thread's tracer and fails ("NameError: module is not installed as a
submodule"): a request running a network eager while the warm-up compiles another, or the same one. PyTorch makes the
patch thread-local upstream (pytorch/pytorch#187589, for #126024); until the installed torch has it, each patch made
here calls the tracer's wrapper only in the thread that made it and the original everywhere else.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

_ISOLATED = "_rocm_zoo_thread_isolated"


def isolate_fx_tracing_patches() -> None:
    """Idempotent; for the process."""
    from torch.fx import _symbolic_trace

    patcher = _symbolic_trace._Patcher
    if getattr(patcher.patch_method, _ISOLATED, False):
        return
    patch_method = patcher.patch_method

    def thread_isolated(self: Any, cls: type, name: str, new_fn: Callable[..., Any], deduplicate: bool = True):
        owner, original = threading.get_ident(), getattr(cls, name)

        def in_the_tracing_thread_only(*args: Any, **kwargs: Any) -> Any:
            return (new_fn if threading.get_ident() == owner else original)(*args, **kwargs)

        return patch_method(self, cls, name, in_the_tracing_thread_only, deduplicate)

    setattr(thread_isolated, _ISOLATED, True)
    patcher.patch_method = thread_isolated
