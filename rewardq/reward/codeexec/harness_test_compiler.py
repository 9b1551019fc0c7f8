"""The compiler of ``assert_case`` test text: what the tests run in the sandbox, rewritten so the
harness sees every assertion run and hold (:mod:`.harness_asserts` runs the result).

:func:`compile_tests` parses the text and rewrites it: every ``assert`` (and every unittest
``self.assert*`` call) becomes a call of a hook that records that assertion ``k`` ran and held,
every comparison and every truth test goes through a hook (the tripwires' checks,
:mod:`.harness_wires`), and top-level ``test_*`` functions the text never calls are called
(pytest's collection, for KodCode-style tests). :class:`TestCode` says which assertions were due,
given the test functions that ran.

Loaded by path, like every ``harness_*`` module: standard library only, never rewardq.
"""

from __future__ import annotations

import ast
import types

__all__ = ["TestCode", "compile_tests"]

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


class TestCode:
    """One case's test text, compiled to report to the harness.

    Attributes:
        code: what runs; required: per ``assert`` statement, whose run makes it due (-1: the
            module's, a function's number, None: never, it sits in the test's own branches);
        names: every name it reads, imports or calls; attrs: every attribute name it reads.
    """

    __test__ = False

    def __init__(
        self,
        code: types.CodeType,
        required: list[int | None],
        names: frozenset[str],
        attrs: frozenset[str],
        methods: frozenset[int] = frozenset(),
    ) -> None:
        self.code, self.required, self.names, self.attrs, self.methods = code, required, names, attrs, methods

    def due(self, entered: set[int]) -> list[int]:
        """The assertions that had to run, given the test functions that ran."""
        return [k for k, owner in enumerate(self.required) if owner is not None and (owner == -1 or owner in entered)]

    def skipped(self, entered: set[int]) -> int:
        """How many of the text's unittest test methods never ran."""
        return len(self.methods - entered)


_BRANCHES = tuple(
    getattr(ast, n) for n in ("If", "For", "AsyncFor", "While", "Try", "TryStar", "Match") if hasattr(ast, n)
)


def _method_assert(node: ast.AST) -> bool:
    """Whether ``node`` is a statement ``self.assert<Something>(...)`` (unittest's assertions)."""
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return False
    func = node.value.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr.startswith("assert")
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    )


def _test_case_class(node: ast.AST) -> bool:
    """Whether ``node`` is a class whose bases name a ``TestCase`` (``unittest.TestCase``, ...)."""
    if not isinstance(node, ast.ClassDef):
        return False
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""
        if name.endswith("TestCase"):
            return True
    return False


def _owners(tree: ast.Module) -> tuple[dict[int, int | None], dict[int, int], set[int]]:
    """Which assertions must run: ``{id(assert): its function's number, -1 for the module, None
    when it sits in a branch, a loop or a ``try`` (the test's own control flow may skip it)}``
    (``self.assertEqual(...)`` and unittest's other assertion calls count as assertions),
    ``{id(function): its number}``, and the numbers of the ``test*`` methods of the text's classes
    (unittest's tests: each must run)."""
    owners: dict[int, int | None] = {}
    functions: dict[int, int] = {}
    methods: set[int] = set()

    def walk(node: ast.AST, owner: int, straight: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                number = functions.setdefault(id(child), len(functions))
                if _test_case_class(node) and child.name.startswith("test"):
                    methods.add(number)
                walk(child, number, True)
                continue
            if isinstance(child, ast.Assert) or _method_assert(child):
                owners[id(child)] = owner if straight else None
            walk(child, owner, straight and not isinstance(child, _BRANCHES))

    walk(tree, -1, True)
    return owners, functions, methods


class _Rewrite(ast.NodeTransformer):
    def __init__(self, hooks: dict[str, str], tree: ast.Module) -> None:
        self.hooks = hooks
        self.asserts = 0
        self.owners, self.functions, self.methods = _owners(tree)
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

    def visit_Expr(self, node: ast.Expr) -> ast.Expr:
        """``self.assertEqual(a, b)`` becomes ``method(k, self.assertEqual, a, b)``: the harness sees
        it run and hold, and checks its values as it checks an ``assert``'s comparison."""
        if not _method_assert(node):
            self.generic_visit(node)
            return node
        self.required.append(self.owners.get(id(node)))
        self.generic_visit(node)
        call = node.value
        assert isinstance(call, ast.Call)  # checked by _method_assert
        hook = ast.Name(self.hooks["method"], ast.Load())
        node.value = ast.Call(hook, [ast.Constant(self.asserts), call.func, *call.args], call.keywords)
        self.asserts += 1
        return node

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
    """Call the top-level ``test_*`` functions without parameters that the text never calls, and
    run the text's unittest classes when it never calls ``main`` (pytest collects both)."""
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    calls_main = any(
        isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Attribute) and n.func.attr in ("main", "run"))
            or (isinstance(n.func, ast.Name) and n.func.id == "main")
        )
        for n in ast.walk(tree)
    )
    has_cases = any(
        _test_case_class(node) and any(isinstance(f, ast.FunctionDef) and f.name.startswith("test") for f in node.body)  # type: ignore[attr-defined]  # a ClassDef
        for node in tree.body
    )
    if has_cases and not calls_main:
        run = ast.parse("__import__('unittest').main(argv=['tests'], exit=False)").body[0]
        tree.body.append(run)
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
    code = compile(tree, "<tests>", "exec")
    return TestCode(code, rewrite.required, frozenset(names), frozenset(attrs), frozenset(rewrite.methods))
