"""The ``assert_case`` runner's pieces that need no sandbox: the test compiler, the value checks
of the tripwires, and the report fields they write. (The audit hook is never added here: once
added, a hook stays for the life of the process; the integration tests exercise it.)"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rewardq.reward.codeexec.harness_fs import interpreter_prefixes
from rewardq.reward.codeexec.report import MalformedRecord, parse_record

HERE = Path(__file__).resolve().parents[2] / "rewardq" / "reward" / "codeexec"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"unit_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


asserts = _load("harness_asserts")
compiler = _load("harness_test_compiler")
wires_mod = _load("harness_wires")
HOOKS = {k: f"rq_h_{k}" for k in asserts.HOOKS}


class Trips:
    def __init__(self) -> None:
        self.fired: list[tuple[str, str]] = []

    def __call__(self, name: str, detail: str) -> None:
        self.fired.append((name, detail))


def _wires() -> tuple[Any, Trips]:
    trips = Trips()
    return wires_mod.Wires(trips, interpreter_prefixes(), str(HERE)), trips


def _program(source: str) -> dict[str, Any]:
    """``source`` run as the program would be: code objects named ``<solution>``."""
    space: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "<solution>", "exec"), space)
    return space


def _run_tests(text: str, space: dict[str, Any]) -> tuple[Any, Any, Trips, str]:
    """Compile ``text`` as the harness does and run it against ``space`` with real hooks."""
    wires, trips = _wires()
    run = asserts.Run({"fn_name": None}, 0, wires)
    run.hooks = HOOKS
    tests = compiler.compile_tests(text, HOOKS)
    test_space = dict(space)
    test_space.update(run.hook_functions(tests.names))
    error = run.test(tests, test_space)
    return tests, run, trips, error


_UNITTEST = (
    "import io, unittest\n"
    "class T(unittest.TestCase):\n"
    "    def test_a(self):\n"
    "        self.assertEqual(f(), 3)\n"
    "        assert f() > 0\n"
    "    def test_b(self):\n"
    "        self.assertIn(f(), [3])\n"
    "unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(T))\n"
)


def test_unittest_assertions_count_as_assertions_inside_a_class_body() -> None:
    # the hooks are called from methods of a class: their names survive the class's name mangling
    tests, run, trips, error = _run_tests(_UNITTEST, _program("def f():\n    return 3"))
    assert (error, run.failed, trips.fired) == ("", [], [])
    assert run.ran == {0, 1, 2} and tests.due(run.entered) == [0, 1, 2] and tests.skipped(run.entered) == 0


def test_a_failed_unittest_assertion_fails_the_case_though_unittest_catches_it() -> None:
    _, run, trips, error = _run_tests(_UNITTEST, _program("def f():\n    return 4"))
    assert error == "" and run.failed and not trips.fired


def test_an_always_equal_object_passed_to_assert_equal_trips_a_wire() -> None:
    _, run, trips, _ = _run_tests(_UNITTEST, _program(_says("__eq__", True, "A()")))
    assert [name for name, _ in trips.fired][:1] == ["non_plain_value"]


def test_unittest_methods_that_never_ran_are_counted() -> None:
    text = "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(f(), 3)\n"
    tests = compiler.compile_tests(text, HOOKS)
    assert tests.methods and tests.skipped(set()) == 1
    # a text that never calls main gets a run of unittest appended (as pytest would collect it)
    assert "main" in tests.code.co_names


def _says(dunder: str, answer: bool, returned: str) -> str:
    """A program whose class ``A`` answers ``answer`` through ``dunder``, and ``f()`` returning ``returned``."""
    return f"class A:\n    def {dunder}(s, o):\n        return {answer}\ndef f():\n    return {returned}"


def test_every_assert_reports_that_it_ran_and_whether_it_held() -> None:
    space = _program("def add(a, b):\n    return a + b")
    tests, run, trips, error = _run_tests("assert add(1, 2) == 3\nassert add(1, 1) == 3, 'off'\nassert True", space)
    assert (error, trips.fired) == ("", [])
    assert run.ran == {0, 1} and run.failed == ["assertion 2 failed"]  # the third never ran: the second raised
    assert tests.due(run.entered) == [0, 1, 2]


def test_assertions_in_the_tests_own_branches_are_not_due_but_straight_ones_are() -> None:
    text = (
        "try:\n    g()\n    assert False\nexcept ValueError:\n    pass\n"
        "for x in []:\n    assert x\n"
        "def check(c):\n    assert c() == 1\n"
        "def unused():\n    assert False\n"
        "check(f)\n"
    )
    program = _program("def f():\n    return 1\ndef g():\n    raise ValueError\n")
    tests, run, trips, error = _run_tests(text, program)
    assert (error, run.failed, trips.fired) == ("", [], [])
    # check()'s assertion was due and ran; unused() never ran; the test's own branches are never due
    assert tests.required == [None, None, 0, 1] and tests.due(run.entered) == [2] and run.ran == {2}


def test_pytest_style_functions_are_called_when_the_text_does_not() -> None:
    text = "def test_a():\n    assert f() == 1\n\ndef test_b(x=2):\n    assert f() + x == 3\n\n"
    text += "def test_c(y):\n    pass\n"
    tests, run, trips, error = _run_tests(text, _program("def f():\n    return 1"))
    assert error == "" and run.ran == {0, 1} and not run.failed
    assert tests.due(run.entered) == [0, 1]


def test_chained_and_boolean_comparisons_keep_their_meaning() -> None:
    text = "assert 1 < f() < 3\nassert not (f() > 5) and f() in [1, 2]\nx = f() or 7\nassert x == 2"
    _, run, trips, error = _run_tests(text, _program("def f():\n    return 2"))
    assert (error, run.failed, trips.fired) == ("", [], [])


def test_numpy_comparisons_return_arrays_as_without_the_harness() -> None:
    np = pytest.importorskip("numpy")
    text = "import numpy as np\nassert (f() == np.array([1, 2])).all()\nassert f().shape == (2,)"
    _, run, trips, error = _run_tests(text, _program("import numpy as np\ndef f():\n    return np.array([1, 2])"))
    assert (error, run.failed, trips.fired) == ("", [], [])
    assert np  # used


@pytest.mark.parametrize(
    ("program", "test", "wire"),
    [
        (_says("__eq__", True, "A()"), "assert f() == 3", "non_plain_value"),
        (_says("__eq__", True, "[A()]"), "assert f() == [1]", "non_plain_value"),
        (_says("__lt__", True, "A()"), "assert f() < 0", "non_plain_value"),
        (_says("__ne__", True, "A()"), "assert f() != 1", "non_plain_value"),
        (
            "class A:\n    def __eq__(s, o):\n        return True\ndef f():\n    return A()",
            "assert f() == A()",
            "eq_override",
        ),
        ("class T:\n    def __bool__(s):\n        return True\ndef f():\n    return T()", "assert f()", "eq_override"),
        (  # a list that hides what it holds from iteration: read through list's own
            _says("__eq__", True, "L([A()])") + "\nclass L(list):\n    def __iter__(s):\n        return iter([])",
            "assert f() == [1]",
            "non_plain_value",
        ),
        (
            "class C:\n    def __contains__(s, x):\n        return True\ndef f():\n    return C()",
            "assert 3 in f()",
            "eq_override",
        ),
    ],
)
def test_values_that_fake_a_comparison_trip_a_wire(program: str, test: str, wire: str) -> None:
    _, run, trips, _ = _run_tests(test, _program(program))
    assert [name for name, _ in trips.fired] == [wire] and run.failed


@pytest.mark.parametrize(
    ("program", "test"),
    [
        # a class of its own compared with one the test builds from it
        (
            "class P:\n    def __init__(s, x):\n        s.x = x\n    def __eq__(s, o):\n"
            "        return isinstance(o, P) and s.x == o.x\ndef f():\n    return P(1)",
            "assert f() == P(1)\nassert f() != P(2)",
        ),
        # a class with its own __bool__, asked for its truth by name (not as a call's result)
        ("class S:\n    def __bool__(s):\n        return False\ns = S()", "assert not s"),
        # a wrong answer of its own type is a wrong answer, not a hack
        ("class A:\n    def __eq__(s, o):\n        return NotImplemented\ndef f():\n    return A()", "assert f() == 3"),
        # library types with Python comparisons: Counter, Fraction
        (
            "from collections import Counter\nfrom fractions import Fraction\ndef f():\n    return Counter('aab')\n"
            "def g():\n    return Fraction(1, 2)",
            "assert f() == {'a': 2, 'b': 1}\nassert g() == 0.5\nassert g() < 1",
        ),
        # a generator, an object without a comparison: no wire, just the comparison's answer
        ("def f():\n    yield 1\ndef g():\n    return object()", "assert list(f()) == [1]\nassert g() != 3"),
    ],
)
def test_honest_values_trip_no_wire(program: str, test: str) -> None:
    _, run, trips, error = _run_tests(test, _program(program))
    assert trips.fired == [], trips.fired
    assert error == ""


def test_the_wrong_answer_of_an_own_type_fails_without_a_wire() -> None:
    _, run, trips, _ = _run_tests("assert f() == 3", _program("class A:\n    pass\ndef f():\n    return A()"))
    assert run.failed and trips.fired == []


def test_a_replaced_builtin_or_library_function_is_found() -> None:
    wires, _ = _wires()
    assert wires.builtins_changed() == ""
    program = _program("def fake(*a, **k):\n    return True")
    module = types.ModuleType("fakemath")
    module.__file__ = str(Path(interpreter_prefixes()[0]) / "lib" / "fakemath.py")
    module.isclose = program["fake"]  # type: ignore[attr-defined]  # the program's function on a library module
    sys.modules["fakemath"] = module
    try:
        assert wires.library_patched(frozenset({"isclose"})) == "fakemath.isclose"
    finally:
        del sys.modules["fakemath"]
    assert wires.library_patched(frozenset({"isclose"})) == ""


def test_code_is_told_apart_by_where_it_was_compiled() -> None:
    wires, _ = _wires()
    assert wires.where("<solution>") == "program" and wires.where("<string>") == "program"
    assert wires.where("<tests>") == "tests" and wires.where(str(HERE / "harness.py")) == "harness"
    assert wires.where(types.__file__) == "library" and wires.where("<frozen os>") == "library"


def test_the_new_record_fields_parse_and_nothing_else_does() -> None:
    rec = parse_record(b'{"case":0,"ran":2,"asserts":3,"held":false,"failed":"assertion 3 failed","out":""}')
    assert rec["held"] is False and rec["ran"] == 2
    assert parse_record(b'{"tripwire":"early_exit","detail":"x"}') == {"tripwire": "early_exit", "detail": "x"}
    for bad in (b'{"ran":-1}', b'{"held":1}', b'{"asserts":"2"}', b'{"token":"x"}'):
        with pytest.raises(MalformedRecord):
            parse_record(bad)
