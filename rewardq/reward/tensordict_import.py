"""Importing tensordict in a worker without loading torch's compiler (Dynamo) for nothing.

tensordict 0.15 marks a few functions for ``torch.compile`` while it is imported: it calls
``torch.compiler.allow_in_graph`` (functorch's batching functions, ``_foreach_copy_``) and
``torch.compiler.assume_constant_result`` (a warning helper). Each of those calls imports all of
``torch._dynamo``, which pulls in sympy, ``torch.distributed`` and ``torch.onnx``: ~1.2 s of CPU,
more than half of what importing torch and tensordict costs a worker (a worker's whole start is
~2.5 s of CPU), paid again by every worker process started. A worker never compiles anything.

:func:`import_tensordict` imports tensordict with those two calls recorded instead of run, and
hands the recorded functions to Dynamo's own ``allow_in_graph`` and ``assume_constant_result`` the
moment anything in the process imports ``torch._dynamo`` (a reward function that compiles, say,
or ``transformers``' ``AutoTokenizer``, whose import loads Dynamo: a worker that loads a tokenizer
folder through transformers pays for Dynamo in that step instead), so Dynamo then knows exactly
what an ordinary import would have told it. Both return the function
they are given (torch 2.6-2.13), so tensordict's module holds the same objects either way.

Where ``torch._dynamo`` is loaded already, or tensordict imports it itself (tensordict 0.10, verl
0.9.1's pin, imports ``torch._dynamo.graph_break`` directly), the calls go straight to Dynamo: the
import is the ordinary one and nothing is saved. The post-import hook below is written here
because neither environment rewardq installs into has a library for it (``wrapt`` has one, but
verl's environment does not ship ``wrapt``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

DYNAMO = "torch._dynamo"
# the torch.compiler functions tensordict calls while it is imported, each of which imports Dynamo
MARKERS = ("allow_in_graph", "assume_constant_result")

Marked = tuple[str, Callable[..., Any]]  # (the torch.compiler function's name, the function it was given)


def import_tensordict() -> list[Marked]:
    """Import torch and tensordict (see the module's docstring); returns the marks left for Dynamo
    (empty where the import was the ordinary one)."""
    if "tensordict" in sys.modules or DYNAMO in sys.modules:
        import tensordict  # already imported, or Dynamo is here anyway

        return []
    import torch.compiler as compiler

    originals = {name: getattr(compiler, name) for name in MARKERS}
    pending: list[Marked] = []

    def recorder(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
            if DYNAMO in sys.modules:  # tensordict imported Dynamo itself: the ordinary call
                return originals[name](fn)  # type: ignore[no-any-return]
            pending.append((name, fn))
            return fn

        return mark

    for name in MARKERS:
        setattr(compiler, name, recorder(name))
    hook = MarkWhenImported(pending)
    sys.meta_path.insert(0, hook)
    try:
        import tensordict  # noqa: F401
    finally:
        for name, original in originals.items():
            setattr(compiler, name, original)
    if DYNAMO in sys.modules:  # imported during tensordict's import: the hook has handed them over
        hook.detach()
        return []
    return pending


class MarkWhenImported(importlib.abc.MetaPathFinder):
    """On the import of ``torch._dynamo``, runs the recorded marks through Dynamo's own functions
    once its module has been executed (a finder that wraps the found loader's ``exec_module``)."""

    def __init__(self, pending: Sequence[Marked]) -> None:
        self.pending = pending

    def detach(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != DYNAMO:
            return None
        if fullname in sys.modules:  # imported by a way that did not ask this finder: nothing to hand over
            self.detach()
            return None
        # the spec the import would have found: the hook stays until a module is executed from it, since
        # a probe (importlib.util.find_spec) asks for a spec and loads nothing
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = spec.loader if spec is not None else None
        if spec is None or not isinstance(loader, importlib.abc.Loader):
            return None
        exec_module = loader.exec_module
        pending, detach = self.pending, self.detach

        def exec_then_mark(module: ModuleType) -> None:
            exec_module(module)
            detach()
            for name, fn in pending:
                getattr(module, name)(fn)

        loader.exec_module = exec_then_mark  # type: ignore[method-assign]
        return spec
