"""Loading custom scoring functions from files and modules (verl's custom_reward_function)."""

from __future__ import annotations

import functools
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq.errors import ConfigError
from rewardq.reward.execution.loader import bind_kwargs, is_async_callable, load_score_fn, module_name_for, split_spec
from tests.support.checks import must

CALL: dict[str, Any] = dict(data_source="d", solution_str="s", ground_truth="g", extra_info={})


def write(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "rewards" / "my_reward.py",
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            return (1.0 if solution_str == ground_truth else 0.0) + bonus

        def other(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
            return {"score": 0.5, "kwargs": sorted(kwargs)}

        async def async_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            return 2.0 + bonus

        NOT_A_FUNCTION = 3
    """,
    )


@pytest.fixture
def reward_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = tmp_path / "site"
    write(root / "team_rewards" / "__init__.py", "")
    write(
        root / "team_rewards" / "qa.py",
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 0.25

        def strict(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
            return scale * (solution_str == ground_truth)
    """,
    )
    write(root / "team_rewards" / "broken.py", "import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(root))
    yield "team_rewards"
    for name in [m for m in sys.modules if m.startswith("team_rewards")]:
        del sys.modules[name]


def test_empty_spec_means_default_scorer() -> None:
    assert load_score_fn(None) is None
    assert load_score_fn("") is None
    with pytest.raises(ConfigError, match="without a reward function"):
        load_score_fn(None, {"bonus": 1})


def test_file_default_function_name(reward_file: Path) -> None:
    fn = must(load_score_fn(str(reward_file)))
    assert fn.__name__ == "compute_score"
    assert fn(data_source="d", solution_str="a", ground_truth="a") == 1.0
    assert fn(data_source="d", solution_str="a", ground_truth="b") == 0.0


def test_file_named_function(reward_file: Path) -> None:
    fn = must(load_score_fn(f"{reward_file}:other"))
    assert fn(**CALL) == {"score": 0.5, "kwargs": []}


def test_file_module_name_is_unique_per_path_and_stable(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "reward.py", "def compute_score(**kw):\n    return 1.0\n")
    b = write(tmp_path / "b" / "reward.py", "def compute_score(**kw):\n    return 2.0\n")
    fa, fb = must(load_score_fn(str(a))), must(load_score_fn(str(b)))
    assert fa(**CALL) == 1.0 and fb(**CALL) == 2.0  # same basename, no collision
    assert fa.__module__ != fb.__module__
    assert fa.__module__ == module_name_for(str(a)) and fa.__module__ in sys.modules
    assert load_score_fn(str(a)).__module__ == fa.__module__


def test_module_spec(reward_package: str) -> None:
    assert must(load_score_fn(f"{reward_package}.qa"))(**CALL) == 0.25
    strict = must(load_score_fn(f"{reward_package}.qa:strict", {"scale": 3.0}))
    assert strict(data_source="d", solution_str="x", ground_truth="x") == 3.0


def test_sync_kwargs_are_bound_and_call_time_keywords_win(reward_file: Path) -> None:
    fn = load_score_fn(f"{reward_file}:compute_score", {"bonus": 0.5})
    assert isinstance(fn, functools.partial)
    assert not is_async_callable(fn)
    assert fn(data_source="d", solution_str="a", ground_truth="a") == 1.5
    assert fn(data_source="d", solution_str="a", ground_truth="a", bonus=0.0) == 1.0
    other = must(load_score_fn(f"{reward_file}:other", {"temperature": 0.1, "judge": "gpt"}))
    assert other(**CALL)["kwargs"] == ["judge", "temperature"]


async def test_async_function_stays_async_with_kwargs(reward_file: Path) -> None:
    plain = must(load_score_fn(f"{reward_file}:async_score"))
    assert is_async_callable(plain)
    assert await plain(**CALL) == 2.0
    bound = must(load_score_fn(f"{reward_file}:async_score", {"bonus": 1.0}))
    assert is_async_callable(bound)
    assert await bound(**CALL) == 3.0
    assert getattr(bound, "keywords", None) == {"bonus": 1.0}  # an async function's binding sets it like a partial


async def test_bind_kwargs_on_async_callable_object() -> None:
    class Judge:
        async def __call__(
            self,
            *,
            data_source: str,
            solution_str: str,
            ground_truth: Any,
            extra_info: dict[str, Any] | None = None,
            model: str = "m",
        ) -> dict[str, Any]:
            return {"score": 1.0, "model": model}

    bound = bind_kwargs(Judge(), {"model": "big"})
    assert is_async_callable(bound)
    # a bare functools.partial would hide the coroutine here:
    assert not is_async_callable(functools.partial(Judge(), model="big"))
    assert await bound(**CALL) == {"score": 1.0, "model": "big"}


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_score_fn(f"{missing}:compute_score")
    assert str(missing) in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "dir.py").mkdir()
    with pytest.raises(ConfigError, match="directory"):
        load_score_fn(str(tmp_path / "dir.py"))


def test_missing_function_lists_what_is_there(reward_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_score_fn(f"{reward_file}:compute_scor")
    message = str(info.value)
    assert "'compute_scor'" in message and "compute_score" in message and "async_score" in message


def test_not_callable(reward_file: Path) -> None:
    with pytest.raises(ConfigError, match="not a function"):
        load_score_fn(f"{reward_file}:NOT_A_FUNCTION")


def test_file_that_fails_to_import(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.py", "def compute_score(:\n")
    with pytest.raises(ConfigError, match="SyntaxError") as info:
        load_score_fn(str(bad))
    assert str(bad) in str(info.value)
    assert module_name_for(str(bad)) not in sys.modules


def test_missing_module_and_broken_module(reward_package: str) -> None:
    with pytest.raises(ConfigError, match="no module named 'no_such_pkg.rewards'.*PYTHONPATH"):
        load_score_fn("no_such_pkg.rewards:compute_score")
    with pytest.raises(ConfigError, match="a_dependency_that_is_not_installed"):
        load_score_fn(f"{reward_package}.broken")


def test_kwargs_checked_against_the_signature(reward_file: Path) -> None:
    with pytest.raises(ConfigError, match="cannot take"):
        load_score_fn(f"{reward_file}:compute_score", {"bonsu": 1.0})
    with pytest.raises(ConfigError, match="may not set"):
        load_score_fn(f"{reward_file}:other", {"extra_info": {}})


def test_function_that_cannot_take_the_scoring_keywords(tmp_path: Path) -> None:
    f = write(tmp_path / "narrow.py", "def compute_score(solution_str, ground_truth):\n    return 0.0\n")
    with pytest.raises(ConfigError, match="data_source"):
        load_score_fn(str(f))


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("a/b.py:f", ("a/b.py", "f")),
        ("a/b.py", ("a/b.py", "compute_score")),
        ("pkg.mod:Cls.method", ("pkg.mod", "Cls.method")),
        ("pkg.mod", ("pkg.mod", "compute_score")),
        (r"C:\rewards\r.py", (r"C:\rewards\r.py", "compute_score")),
        (r"C:\rewards\r.py:score", (r"C:\rewards\r.py", "score")),
    ],
)
def test_split_spec(spec: str, expected: tuple[str, str]) -> None:
    assert split_spec(spec) == expected


def test_trailing_colon_is_an_error() -> None:
    with pytest.raises(ConfigError, match="ends with ':'"):
        split_spec("pkg.mod:")
