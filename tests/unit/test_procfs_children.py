"""``benchmarks.procfs.children``: a thread that ends while its process's children are read hides
only its own children."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest

from benchmarks import procfs


def test_a_thread_gone_between_the_listing_and_its_read_hides_no_other_threads_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a process of three threads, the middle one ending after /proc listed it
    files = {"/proc/7/task/7/children": "100 101 ", "/proc/7/task/9/children": "102 "}

    def listdir(path: str) -> list[str]:
        assert path == "/proc/7/task"
        return ["7", "8", "9"]

    def fake_open(path: str, *args: Any, **kw: Any) -> io.StringIO:
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(procfs, "open", fake_open, raising=False)
    # Then the children of the threads before and after it are all found
    assert procfs.children(7) == [100, 101, 102]


def test_a_process_gone_has_no_children(monkeypatch: pytest.MonkeyPatch) -> None:
    def listdir(path: str) -> list[str]:
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "listdir", listdir)
    assert procfs.children(7) == []
