"""Entry points installed for one test, as a third-party package's wheel installs them: a
``*.dist-info`` folder with ``METADATA`` and ``entry_points.txt``, put on ``sys.path`` (where
:func:`importlib.metadata.entry_points` looks) and taken off again."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["installed_entry_points"]


@contextlib.contextmanager
def installed_entry_points(
    folder: Path, group: str, entries: Mapping[str, str], *, dist: str = "rewardq-test-plugin"
) -> Iterator[None]:
    """``entries`` (``{name: "module:attr"}``) declared in ``group`` while the block runs."""
    info = folder / f"{dist.replace('-', '_')}-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
    lines = [f"[{group}]", *(f"{name} = {value}" for name, value in entries.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
