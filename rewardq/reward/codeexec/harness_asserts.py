"""``assert_case`` tests in the sandbox: the program, then one case's assertions, in one runner
process, reported as passed only when the harness saw every assertion run and hold.

Loaded by path from :mod:`.harness` (standard library only, never rewardq). SandboxFusion runs
``program + "\\n\\n" + assert_case`` as one script and passes it when it exits 0; that is where the
known reward hacks live (``sys.exit(0)`` before the asserts, an ``__eq__`` that always says yes,
patched builtins). Here, in order, before any of the program runs:

1. the test text is **compiled by the harness** (:mod:`.harness_test_compiler`): every ``assert``
   becomes a call that records that assertion ``k`` ran and held, every comparison and every
   truth test goes through :mod:`.harness_wires`' checks, and top-level ``test_*`` functions the
   text never calls are called (pytest's collection, for KodCode-style tests);
2. the tripwires are armed (an audit hook, snapshots; :mod:`.harness_wires`);
3. the program runs as ``__main__`` (``solution`` imports it too), with the case's input on
   stdin and a ``__file__`` where no file is (reading it trips ``tests_read``). ``sys.exit`` or
   ``os._exit`` there ends the program, not the run: the assertions still run (an honest program
   may end with ``sys.exit()``; one that exits *and* then fails them is what would have fooled
   SandboxFusion, and the worker flags it ``early_exit``);
4. the tests run in a namespace of their own (a copy of the program's: the program's functions
   cannot see the test's variables through their globals);
5. the harness (not the program) writes the case's record ``{"case", "ran", "asserts", "held",
   "out"}`` and ``{"done"}`` on the report pipe with the run's token, which the program never
   learns without tripping ``tests_read``; the supervisor drops (and reports) every line without it.
"""

from __future__ import annotations

import builtins
import io
import json
import operator
import os
import posix
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # loaded by path at run time, beside this file
    from rewardq.reward.codeexec.harness_test_compiler import TestCode
    from rewardq.reward.codeexec.harness_wires import Wires

_contains = operator.contains
_REAL: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "is": operator.is_,
    "is not": operator.is_not,
    "in": lambda a, b: _contains(b, a),
    "not in": lambda a, b: not _contains(b, a),
}


#: The functions the compiled tests call (:meth:`Run.hook_functions`).
HOOKS = ("check", "cmp", "chain", "truth", "enter", "method")
#: unittest's assertion methods whose first two arguments the tests compare (``==``, ``!=``, ``in``).
_METHOD_OPS = {
    "assertEqual": "==",
    "assertEquals": "==",
    "assertListEqual": "==",
    "assertTupleEqual": "==",
    "assertDictEqual": "==",
    "assertSetEqual": "==",
    "assertSequenceEqual": "==",
    "assertMultiLineEqual": "==",
    "assertCountEqual": "==",
    "assertAlmostEqual": "==",
    "assertNotEqual": "!=",
    "assertNotEquals": "!=",
    "assertIn": "in",
    "assertNotIn": "not in",
    "assertLess": "<",
    "assertLessEqual": "<=",
    "assertGreater": ">",
    "assertGreaterEqual": ">=",
}


class Reporter(Protocol):
    """The runner's authenticated report writer (``harness._Records``)."""

    fd: int
    left: int

    def emit(self, record: dict[str, object]) -> dict[str, Any]: ...


class _Exit(SystemExit):
    """What ``os._exit`` raises while a program and its tests run (see the module docstring)."""


def _exit_instead(runner: int, real: Callable[[int], None]) -> Callable[[int], None]:
    """``os._exit`` for the program: in the runner, an exception (the run goes on); in a process it
    forked (``multiprocessing`` ends its children so), the real one."""
    getpid = os.getpid

    def exit_(code: int) -> None:
        if getpid() != runner:
            real(code)
        raise _Exit(code)

    return exit_


class Run:
    """One case: the program, its assertions and the report. See the module docstring."""

    def __init__(self, job: dict[str, Any], case: int, wires: Wires) -> None:
        self.job, self.case, self.wires = job, case, wires
        tag = os.urandom(6).hex()  # names the program cannot guess (it never sees the tests' namespace)
        self.hooks = {k: f"rq_{tag}_{k}" for k in HOOKS}  # no leading "__": a class body would mangle it
        self.ran: set[int] = set()
        self.entered: set[int] = set()
        self.failed: list[str] = []
        self.exited = ""

    def hook_functions(self, test_names: frozenset[str]) -> dict[str, object]:
        """The functions the compiled tests call, closed over this run's state."""
        ran, failed, wires, real = self.ran, self.failed, self.wires, dict(_REAL)
        compare, truth, changed = wires.compare, wires.truth, wires.builtins_changed
        add, append = ran.add, failed.append

        def check(k: int, value: bool) -> bool:
            add(k)
            if value is not True:
                append(f"assertion {k + 1} failed")
            patched = changed(test_names)
            if patched:
                wires.fire("builtins_patched", f"builtins.{patched} was replaced while the tests ran")
            return value

        def cmp(op: str, a: object, b: object) -> object:
            return compare(op, a, b, real[op])

        def chain(ops: tuple[str, ...], *values: object) -> object:
            result: object = True
            for i, op in enumerate(ops):
                result = compare(op, values[i], values[i + 1], real[op])
                if not truth(result, False):
                    return result
            return result

        def method(k: int, bound: Callable[..., object], *args: object, **kwargs: object) -> object:
            """One unittest assertion (``self.assertEqual(a, b)``): its values checked as an
            ``assert``'s would be, then run; it held when it returned."""
            name = getattr(bound, "__name__", "")
            op = _METHOD_OPS.get(name)
            if op is not None and len(args) >= 2:
                compare(op, args[0], args[1], real[op])
            elif name in ("assertTrue", "assertFalse") and args:
                truth(args[0], True)
            try:
                result = bound(*args, **kwargs)
            except BaseException:
                add(k)
                append(f"assertion {k + 1} failed")
                raise
            add(k)
            patched = changed(test_names)
            if patched:
                wires.fire("builtins_patched", f"builtins.{patched} was replaced while the tests ran")
            return result

        functions = {
            "check": check,
            "cmp": cmp,
            "chain": chain,
            "truth": truth,
            "enter": self.entered.add,
            "method": method,
        }
        return {self.hooks[k]: f for k, f in functions.items()}

    def load(self, module: types.ModuleType) -> str:
        """Run the program as ``__main__``; "" or why it could not load (its exit is not a failure)."""
        try:
            exec(compile(self.job["module"], "<solution>", "exec"), module.__dict__)
        except SystemExit as exc:
            self.exited = f"{'os._exit' if isinstance(exc, _Exit) else 'sys.exit'}({exc.code!r})"
            if exc.code not in (None, 0):
                return f"the program exited with {self.exited} before the assertions"
        except BaseException as exc:  # noqa: BLE001 - the program's failure is the result
            return _describe(exc)
        return ""

    def shadowed(self, space: dict[str, object], tests: TestCode) -> str:
        """A builtin the tests use that the program rebinds to code of its own (``def sorted``,
        ``len = lambda x: 3``). Not a hack: the problem's function itself (``fn_name``, or the only
        function of the program the tests call), a library's function under a builtin's name
        (``from math import *`` binds ``pow``, ``from numpy import *`` binds ``sum``)."""
        wires = self.wires
        mine = {n for n in tests.names if n in space and not n.startswith("__")}
        callables = {n for n in mine if callable(space[n]) and n not in wires.builtins}
        for name in sorted(mine & wires.builtins.keys()):
            value = space[name]
            if value is wires.builtins[name] or name == self.job.get("fn_name") or not wires.program_made(value):
                continue
            if not callables and len(mine) == 1:
                continue  # the function under test happens to be named like a builtin
            return str(name)
        return ""

    def test(self, tests: TestCode, space: dict[str, object]) -> str:
        """Run the tests in ``space``; "" or the error that stopped them."""
        wires = self.wires
        try:
            exec(tests.code, space)
        except AssertionError as exc:
            if not self.failed:
                self.failed.append(f"an assertion failed: {_describe(exc)}")
        except SystemExit as exc:
            origin = _origin(exc, wires)
            if origin == "program" and exc.code in (None, 0):
                wires.fire("early_exit", f"the program ended with sys.exit({exc.code!r}) while the assertions ran")
            elif exc.code not in (None, 0):
                whose = "the program's" if origin == "program" else "the test's"
                return f"the run ended with sys.exit({exc.code!r}) in {whose} code"
        except BaseException as exc:  # noqa: BLE001 - the program's (or the test's) failure is the result
            return _describe(exc)
        return ""

    def call(self, space: dict[str, Any], stdin: io.TextIOWrapper) -> None:
        """What SandboxFusion's wrapper does for ``fn_name`` after the asserts: call it with the JSON
        arguments on stdin and print its result (JSON for containers, ``None`` and booleans)."""
        name = self.job["fn_name"]
        try:
            raw = stdin.read()
            args = [json.loads(line) for line in raw.split("\n")] if raw.strip() else []
            target = space[name] if name in space else getattr(space["Solution"](), name)
            result = target(*args)
        except Exception:  # noqa: BLE001 - the wrapper prints nothing then: a wrong answer
            return
        if isinstance(result, (dict, list, tuple)) or result is None or isinstance(result, bool):
            print(json.dumps(result))
        else:
            print(str(result))


def _origin(exc: BaseException, wires: Wires) -> str:
    """Whose code raised ``exc``: the last program or test frame of its traceback."""
    tb, origin = exc.__traceback__, "tests"
    while tb is not None:
        kind = wires.where(tb.tb_frame.f_code.co_filename)
        if kind in ("program", "tests"):
            origin = kind
        tb = tb.tb_next
    return origin


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:2000]
    except BaseException:  # noqa: BLE001 - a __str__ that raises: keep the report small
        return type(exc).__name__


def run_case(
    job: dict[str, Any],
    run: dict[str, Any],
    records: Reporter,
    workdir: str,
    wires: Wires,
    capture: Callable[[int], io.StringIO],
    compile_tests: Callable[[str, dict[str, str]], TestCode],
) -> None:
    """The runner's work in ``assert_case`` mode (see the module docstring); never returns.
    ``compile_tests``: :func:`.harness_test_compiler.compile_tests`, loaded beside this file."""
    exit_now, emit = os._exit, records.emit
    case = run["cases"][0]
    this = Run(job, case, wires)
    try:
        tests = compile_tests(str(job["tests"][case]), this.hooks)
    except (SyntaxError, ValueError) as exc:
        emit({"case": case, "error": f"the test does not compile: {_describe(exc)}"})
        emit({"done": True})
        exit_now(0)
    module = types.ModuleType("__main__")
    space = module.__dict__
    decoy = f"{workdir}/solution.py"
    space.update({"__file__": decoy, "__builtins__": builtins})
    sys.modules["__main__"] = sys.modules["solution"] = module
    sys.argv = [decoy]
    raw = job["inputs"][case]
    stdin = io.TextIOWrapper(io.BytesIO(("" if raw is None else str(raw)).encode("utf-8", "replace")), "utf-8")
    out = capture(max(0, records.left - 8192))
    sys.stdin, sys.stdout = stdin, out
    wires.decoy, wires.report_fd = decoy, records.fd
    for name in [n for n in sys.modules if n in ("ctypes", "_ctypes") or n.startswith("ctypes.")]:
        sys.modules[name] = None  # type: ignore[assignment]  # None blocks the import (the harness loaded ctypes)
    runner = os.getpid()
    os._exit = posix._exit = _exit_instead(runner, exit_now)  # type: ignore[assignment]  # ends the program, not the run
    sys.addaudithook(wires.audit_hook())  # from here on it sees everything, for the life of the process
    load_error = this.load(module)
    error = ""
    if not load_error:
        _checks(this, space, tests)
        tests_module = types.ModuleType("__main__")  # unittest.main() finds the test's classes here
        test_space = tests_module.__dict__
        test_space.update(space)
        test_space.update(this.hook_functions(tests.names))
        test_space["__builtins__"] = builtins
        sys.modules["__main__"] = tests_module
        error = this.test(tests, test_space)
        if not error and job.get("fn_name"):
            this.call(test_space, stdin)
        _checks(this, space, tests)
    due = tests.due(this.entered)
    record: dict[str, Any] = {"case": case, "ran": sum(1 for k in due if k in this.ran), "asserts": len(due)}
    never = tests.skipped(this.entered)
    if never and not (this.failed or error or load_error):
        this.failed.append(f"{never} unittest test method(s) never ran")
    record["held"] = not (this.failed or error or load_error)
    for key, value in (("failed", this.failed[0] if this.failed else ""), ("error", error), ("load_error", load_error)):
        if value:
            record[key] = value
    if this.exited:
        record["exited"] = this.exited
    if os.getpid() != runner:  # a process the program forked got here: only the runner reports
        exit_now(0)
    if getattr(out, "over", False):  # the capture's cap was reached
        record["overflow"] = True
    else:
        record["out"] = io.StringIO.getvalue(out)
    emit(record)
    emit({"done": True})
    exit_now(0)


def _checks(this: Run, space: dict[str, object], tests: TestCode) -> None:
    """The snapshot tripwires: builtins replaced, builtins rebound where the tests use them,
    library functions replaced (reported on the pipe; the worker fails the response)."""
    wires = this.wires
    patched = wires.builtins_changed()
    if patched:
        wires.fire("builtins_patched", f"the program replaced builtins.{patched}")
    rebound = this.shadowed(space, tests)
    if rebound:
        wires.fire("builtins_patched", f"the program rebinds {rebound}, which the tests use as the builtin")
    library = wires.library_patched(tests.attrs | tests.names)
    if library:
        wires.fire("harness_patched", f"the program replaced {library}, which the tests use")
