"""``assert_case`` tests in the sandbox: the program, then one case's assertions, in one runner
process, reported as passed only when the harness saw every assertion run and hold.

Loaded by path from :mod:`.harness` (standard library only, never rewardq). SandboxFusion runs
``program + "\\n\\n" + assert_case`` as one script and passes it when it exits 0; that is where the
known reward hacks live (``sys.exit(0)`` before the asserts, an ``__eq__`` that always says yes,
patched builtins). Here, in order, before any of the program runs:

1. the test text is **compiled by the harness** (:func:`compile_tests`): every ``assert`` becomes
   a call that records that assertion ``k`` ran and held, every comparison and every truth test
   goes through :mod:`.harness_wires`' checks, and top-level ``test_*`` functions the text never
   calls are called (pytest's collection, for KodCode-style tests);
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

import ast
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
    from rewardq.reward.codeexec.harness_wires import Wires

_OPS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
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


class TestCode:
    """One case's test text, compiled to report to the harness.

    Attributes:
        code: what runs; required: per ``assert`` statement, whose run makes it due (-1: the
            module's, a function's number, None: never, it sits in the test's own branches);
        names: every name it reads, imports or calls; attrs: every attribute name it reads.
    """

    __test__ = False

    def __init__(
        self, code: types.CodeType, required: list[int | None], names: frozenset[str], attrs: frozenset[str]
    ) -> None:
        self.code, self.required, self.names, self.attrs = code, required, names, attrs

    def due(self, entered: set[int]) -> list[int]:
        """The assertions that had to run, given the test functions that ran."""
        return [k for k, owner in enumerate(self.required) if owner is not None and (owner == -1 or owner in entered)]


_BRANCHES = tuple(
    getattr(ast, n) for n in ("If", "For", "AsyncFor", "While", "Try", "TryStar", "Match") if hasattr(ast, n)
)


def _owners(tree: ast.Module) -> tuple[dict[int, int | None], dict[int, int]]:
    """Which assertions must run: ``{id(assert): its function's number, -1 for the module, None
    when it sits in a branch, a loop or a ``try`` (the test's own control flow may skip it)}``,
    and ``{id(function): its number}``."""
    owners: dict[int, int | None] = {}
    functions: dict[int, int] = {}

    def walk(node: ast.AST, owner: int, straight: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, functions.setdefault(id(child), len(functions)), True)
                continue
            if isinstance(child, ast.Assert):
                owners[id(child)] = owner if straight else None
            walk(child, owner, straight and not isinstance(child, _BRANCHES))

    walk(tree, -1, True)
    return owners, functions


class _Rewrite(ast.NodeTransformer):
    def __init__(self, hooks: dict[str, str], tree: ast.Module) -> None:
        self.hooks = hooks
        self.asserts = 0
        self.owners, self.functions = _owners(tree)
        self.required: list[int | None] = []  # per assertion: whose run makes it due (see _owners)

    def _call(self, hook: str, args: list[ast.expr]) -> ast.Call:
        return ast.Call(ast.Name(self.hooks[hook], ast.Load()), args, [])

    def truth(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.BoolOp):
            node.values = [self.truth(v) for v in node.values]
            return node
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node.operand = self.truth(node.operand)
            return node
        return self._call("truth", [node, ast.Constant(isinstance(node, ast.Call))])

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        ops: list[ast.expr] = [ast.Constant(_OPS[type(op)]) for op in node.ops]
        if len(ops) == 1:
            return self._call("cmp", [ops[0], node.left, node.comparators[0]])
        return self._call("chain", [ast.Tuple(ops, ast.Load()), node.left, *node.comparators])

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        self.required.append(self.owners.get(id(node)))
        self.generic_visit(node)
        node.test = self._call("check", [ast.Constant(self.asserts), self.truth(node.test)])
        self.asserts += 1
        return node

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        number = self.functions.get(id(node))
        self.generic_visit(node)
        if number is not None:  # say when it runs: its straight-line assertions are then due
            node.body.insert(0, ast.Expr(self._call("enter", [ast.Constant(number)])))
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _test(self, node: ast.If | ast.While | ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        node.test = self.truth(node.test)
        return node

    visit_If = visit_While = visit_IfExp = _test

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.ifs = [self.truth(i) for i in node.ifs]
        return node


def _collect(tree: ast.Module) -> ast.Module:
    """Call the top-level ``test_*`` functions without parameters that the text never calls."""
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    for node in list(tree.body):
        if (
            isinstance(node, ast.FunctionDef)
            and node.name.startswith("test")
            and node.name not in called
            and len(node.args.args) == len(node.args.defaults)
            and not node.args.posonlyargs
        ):
            tree.body.append(ast.Expr(ast.Call(ast.Name(node.name, ast.Load()), [], [])))
    return tree


def compile_tests(text: str, hooks: dict[str, str]) -> TestCode:
    """``text`` compiled as the module docstring says (``hooks``: the hook names to call).

    Raises:
        SyntaxError: the test text does not parse.
    """
    tree = ast.parse(text, "<tests>")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    tree = _collect(tree)
    rewrite = _Rewrite(hooks, tree)
    tree = ast.fix_missing_locations(rewrite.visit(tree))
    return TestCode(compile(tree, "<tests>", "exec"), rewrite.required, frozenset(names), frozenset(attrs))


class Reporter(Protocol):
    """The runner's authenticated report writer (``harness._Records``)."""

    fd: int
    left: int

    def emit(self, record: dict[str, Any]) -> dict[str, Any]: ...


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
        self.hooks = {k: f"__rq_{tag}_{k}" for k in ("check", "cmp", "chain", "truth", "enter")}
        self.ran: set[int] = set()
        self.entered: set[int] = set()
        self.failed: list[str] = []
        self.exited = ""

    def hook_functions(self, test_names: frozenset[str]) -> dict[str, Any]:
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

        functions = {"check": check, "cmp": cmp, "chain": chain, "truth": truth, "enter": self.entered.add}
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

    def shadowed(self, space: dict[str, Any], tests: TestCode) -> str:
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

    def test(self, tests: TestCode, space: dict[str, Any]) -> str:
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
) -> None:
    """The runner's work in ``assert_case`` mode (see the module docstring); never returns."""
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
    runner = os.getpid()
    os._exit = posix._exit = _exit_instead(runner, exit_now)  # type: ignore[assignment]  # ends the program, not the run
    sys.addaudithook(wires.audit_hook())  # from here on it sees everything, for the life of the process
    load_error = this.load(module)
    error = ""
    if not load_error:
        _checks(this, space, tests)
        test_space = dict(space)
        test_space.update(this.hook_functions(tests.names))
        test_space["__builtins__"] = builtins
        error = this.test(tests, test_space)
        if not error and job.get("fn_name"):
            this.call(test_space, stdin)
        _checks(this, space, tests)
    due = tests.due(this.entered)
    record: dict[str, Any] = {"case": case, "ran": sum(1 for k in due if k in this.ran), "asserts": len(due)}
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


def _checks(this: Run, space: dict[str, Any], tests: TestCode) -> None:
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
