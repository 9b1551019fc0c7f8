"""The program side of the local code runner: what ``prime_code`` does around the model's
program, run inside the sandbox by the runner (:mod:`.harness`), after it isolated itself.

Loaded by path from :mod:`.harness` (standard library only, never rewardq): the
``reliability_guard`` switches, loading the module, feeding each case's input (standard input
or call arguments), capturing what it prints (bounded: :class:`Capture`) or returns (as
tagged JSON: :func:`plain`), and describing a failure.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importlib.abc costs every sandbox ~20 ms to import
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

_OS_DISABLED = (
    "kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames truncate "
    "replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir"
).split()
_SHUTIL_DISABLED = ("rmtree", "move", "chown")
_BUILTINS_DISABLED = ("exit", "quit", "help")
_MODULES_BLOCKED = ("ipdb", "joblib", "resource", "psutil", "tkinter", "subprocess", "ctypes")
#: What verl's ``prime_code`` process has imported before its ``reliability_guard`` runs, beyond the
#: standard library: its ``testing_util`` imports numpy at the top.
PRELOADED = ("numpy",)


class _Guard:
    """``prime_code``'s ``reliability_guard`` switches, able to step aside while a module that verl's
    process imports *before* its guard is first imported here (:class:`PreloadedImports`)."""

    def __init__(self) -> None:
        import builtins
        import shutil
        import subprocess

        self.targets: list[tuple[object, str]] = [(os, n) for n in _OS_DISABLED]
        self.targets += [(shutil, n) for n in _SHUTIL_DISABLED] + [(subprocess, "Popen")]
        self.targets += [(builtins, n) for n in _BUILTINS_DISABLED]
        self.saved = [getattr(obj, name, None) for obj, name in self.targets]
        self.modules = {name: sys.modules.get(name) for name in _MODULES_BLOCKED}

    def apply(self) -> None:
        for obj, name in self.targets:
            setattr(obj, name, None)
        for name in _MODULES_BLOCKED:
            sys.modules[name] = None  # type: ignore[assignment]  # None blocks the import on purpose

    def lift(self) -> list[tuple[object, str, object]]:
        """Put back what the guard disabled (where it still is disabled); returns what to undo."""
        undo: list[tuple[object, str, object]] = []
        for (obj, name), value in zip(self.targets, self.saved):
            if getattr(obj, name, None) is None:
                undo.append((obj, name, None))
                setattr(obj, name, value)
        for name, module in self.modules.items():
            if name in sys.modules and sys.modules[name] is None:  # still blocked (a program may unblock it)
                undo.append((sys.modules, name, None))
                if module is None:
                    del sys.modules[name]
                else:
                    sys.modules[name] = module
        return undo

    @staticmethod
    def restore(undo: list[tuple[object, str, object]]) -> None:
        for obj, name, value in undo:
            if isinstance(obj, dict):
                obj[name] = value
            else:
                setattr(obj, name, value)


class _LiftedLoader:
    """A module's own loader, run with the guard lifted (see :class:`PreloadedImports`)."""

    def __init__(self, loader: Loader, guard: _Guard) -> None:
        self.loader = loader
        self.guard = guard

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        undo = self.guard.lift()
        try:
            self.loader.exec_module(module)
        finally:
            self.guard.restore(undo)

    def __getattr__(self, name: str) -> object:  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, name)


class PreloadedImports:
    """Imports, as verl's process does before its guard, what that process has loaded by then.

    verl's ``prime_code`` forks its runs from a process that imported numpy and the standard
    library it uses (and, in a trainer, much more) before ``reliability_guard`` disabled
    ``os.putenv`` and the rest; numpy's own import calls ``os.putenv``. Importing every such module
    in every sandbox in advance would cost each job ~100 ms; instead the first import of a
    standard-library module or of :data:`PRELOADED` (a top-level name not loaded yet) runs with
    the guard lifted, and everything it imports with it, so it ends as it would in verl. A
    submodule imported later (numpy's lazy ones) meets the guard, as it does in verl.
    """

    def __init__(self, guard: _Guard) -> None:
        import importlib.machinery

        self.guard = guard
        self.names = frozenset(sys.stdlib_module_names) | frozenset(PRELOADED)
        self.finder = importlib.machinery.PathFinder
        self.busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        if self.busy or path is not None or fullname not in self.names:
            return None
        self.busy = True
        try:
            spec = self.finder.find_spec(fullname, path, target)
        finally:
            self.busy = False
        if spec is not None and spec.loader is not None:
            spec.loader = _LiftedLoader(spec.loader, self.guard)  # type: ignore[assignment]  # a loader by protocol
        return spec

    def invalidate_caches(self) -> None:
        pass


def reliability_guard() -> None:
    """What ``prime_code`` disables before it runs a program (so programs score the same);
    the isolation itself comes from the process, uid, namespaces and rlimits. Modules verl's
    process imported before its guard still import (:class:`PreloadedImports`)."""
    import faulthandler

    faulthandler.disable()
    guard = _Guard()
    os.environ["OMP_NUM_THREADS"] = "1"
    guard.apply()
    sys.meta_path.insert(0, PreloadedImports(guard))


def plain(value: object) -> Any:
    """A returned value as tagged JSON data (see ``compare.decode_value``)."""
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        f = float(value)
        return f if math.isfinite(f) else {"f": repr(f)}
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return {"t": [plain(v) for v in value]}
    if isinstance(value, dict):
        return {"d": [[plain(k), plain(v)] for k, v in value.items()]}
    raise TypeError(f"cannot report a {type(value).__name__}")


class InputFile:
    """What ``open(...)`` returns while a standard-input program runs: the case's input again.

    ``prime_code`` patches ``builtins.open`` with ``unittest.mock.mock_open(read_data=input)``
    (a fresh read position on every call). A program reaches it only through
    ``builtins.open`` itself: the preamble's ``from builtins import *`` binds the real
    ``open`` in the program's own namespace. This small stand-in reads the same way and keeps
    ``unittest.mock`` (30 ms of imports) out of every sandbox.
    """

    def __init__(self, text: str) -> None:
        self._data = io.StringIO(text)

    def read(self, *args: object) -> str:
        return self._data.read()

    def readline(self, *args: object) -> str:
        return self._data.readline()

    def readlines(self, *args: object) -> list[str]:
        return self._data.readlines()

    def __iter__(self) -> Any:
        return iter(self._data.readlines())

    def __enter__(self) -> InputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write(self, data: Any) -> int:
        return len(data)

    def close(self) -> None:
        pass


def call_stdin_program(method: Any, text: str) -> None:
    """Run ``code()`` with ``text`` as its standard input, as ``prime_code`` feeds it: for the
    call, ``sys.stdin`` is ``io.StringIO(text)`` and ``builtins.open`` opens that text again
    (what its stacked ``unittest.mock.patch`` decorators amount to); ``SystemExit`` ends the
    program normally."""
    import builtins

    real_stdin, real_open = sys.stdin, builtins.open
    sys.stdin = io.StringIO(text)
    builtins.open = lambda *args, **kwargs: InputFile(text)  # type: ignore[assignment]  # stdin-only open()
    try:
        method()
    except SystemExit:
        pass
    finally:
        sys.stdin, builtins.open = real_stdin, real_open


def describe(exc: BaseException) -> str:
    """``Type: message`` (at most 2,000 characters), whatever the exception's ``__str__`` does."""
    try:
        return f"{type(exc).__name__}: {exc}"[:2000]
    except BaseException:  # noqa: BLE001 - a MemoryError, or a __str__ that raises: keep the report small
        return type(exc).__name__


class OutputLimit(Exception):
    """The case printed more than its share of the output limit."""


class Capture(io.StringIO):
    """``sys.stdout`` while a standard-input case runs: at most ``cap`` characters are kept; the
    write that would pass it raises :class:`OutputLimit` (and so does every later one)."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.over = False

    def write(self, text: Any) -> int:
        if self.over or self.tell() + len(text) > self.cap:
            self.over = True
            raise OutputLimit(f"printed more than {self.cap} characters")
        return super().write(text)

    def close(self, *args: object) -> None:
        """prime_code's capture: ``close(x)`` is a no-op taking one argument."""


def stdin_case(method: object, text: str, cap: int) -> dict[str, Any]:
    buf = Capture(max(0, cap))
    real = sys.stdout
    failure: Exception | None = None
    sys.stdout = buf
    try:
        call_stdin_program(method, text)
    except Exception as exc:  # noqa: BLE001 - the program's failure is the result
        failure = exc
    finally:
        sys.stdout = real
    if buf.over:
        io.StringIO.close(buf)
        return {"overflow": True}
    if failure is not None:
        io.StringIO.close(buf)  # free what it printed before building the report (MemoryError)
        return {"error": describe(failure)}
    try:
        return {"out": buf.getvalue()}
    except MemoryError:  # as in prime_code, collecting the output fails and the whole run ends
        io.StringIO.close(buf)
        return {"abort": "MemoryError: its output does not fit in the memory limit"}


def call_case(method: Any, args: Sequence[object]) -> dict[str, Any]:
    try:
        value = method(*args)
        json.dumps(value)  # prime_code's check: an unserialisable result is a runtime error
        encoded = json.dumps(plain(value))
    except Exception as exc:  # noqa: BLE001 - the program's failure is the result
        return {"error": describe(exc)}
    return {"value": encoded}


def call_args(raw: Any) -> list[Any]:
    args = [json.loads(line) for line in raw.split("\n")]
    try:
        if isinstance(args[0], dict):
            args = [{int(k): v for k, v in args[0].items()}]
    except (ValueError, TypeError):  # a key that is not an integer: prime_code leaves such arguments as they are
        pass
    return args


def load(job: dict[str, Any]) -> Any:
    """Execute the program's module and find what each case calls (raises what the program raised)."""
    module = types.ModuleType("tmp_sol")
    exec(compile(job["module"], "<string>", "exec"), module.__dict__)
    sys.modules["tmp_sol"] = module
    target = module.Solution() if job["solution_class"] else module
    return getattr(target, job["fn_name"] or "code")
