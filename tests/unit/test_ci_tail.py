"""tests/support/ci_tail.py: the file CI's verl part waits for is made once the given share of tests is done."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.ci_tail import FILE, SHARE, Tail


def _tail(monkeypatch: pytest.MonkeyPatch, file: Path, share: str, collected: int) -> Tail:
    monkeypatch.setenv(FILE, str(file))
    monkeypatch.setenv(SHARE, share)
    tail = Tail()
    session: Any = SimpleNamespace(testscollected=collected)
    tail.watch(session)
    return tail


def test_the_file_is_made_when_the_share_is_done_and_subprocesses_do_not_inherit_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    file = tmp_path / "ready"
    tail = _tail(monkeypatch, file, "0.5", collected=10)
    assert FILE not in os.environ and SHARE not in os.environ  # the suite's own pytest subprocesses
    for _ in range(4):
        tail.test_done()
    assert not file.exists()
    tail.test_done()
    assert file.exists() and tail.signalled is not None


def test_without_the_variable_nothing_is_made(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(FILE, raising=False)
    tail = Tail()
    tail.watch(SimpleNamespace(testscollected=1))  # type: ignore[arg-type]
    tail.test_done()
    assert tail.file is None and tail.signalled is None and not list(tmp_path.iterdir())
