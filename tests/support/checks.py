"""Assertions that also tell the type checker what a test relies on."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def must(value: T | None) -> T:
    """``value``, asserted present (a reply, a field or a result the test needs)."""
    assert value is not None, "expected a value, got None"
    return value


def detailed(score: float | dict[str, Any]) -> dict[str, Any]:
    """A scoring function's answer with its details: a dict (``score`` and the rest), not a bare number."""
    assert isinstance(score, dict), f"expected a detailed score, got {score!r}"
    return score


def single(result: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
    """A manager's result for a trajectory it scored as a whole: one dict (not one per output)."""
    assert isinstance(result, dict), f"expected one result for the trajectory, got {result!r}"
    return result


def per_output(result: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A manager's results for a trajectory it scored output by output: one dict per output."""
    assert isinstance(result, list), f"expected one result per output, got {result!r}"
    return result
