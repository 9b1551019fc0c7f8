"""A Hugging Face hub cache made by hand: a repository's files as its cached snapshot, for offline tests."""

from __future__ import annotations

from pathlib import Path

#: The commit every hand-made snapshot is filed under (``refs/main`` points at it).
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(home: Path, repo: str, files: dict[str, bytes]) -> Path:
    """``files`` (name -> content) as the cached snapshot of Hub repository ``repo`` in ``home``'s cache
    (what ``HF_HOME=home hf download repo`` leaves); returns the snapshot folder."""
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(SNAPSHOT)
    target = root / "snapshots" / SNAPSHOT
    target.mkdir(parents=True)
    for name, content in files.items():
        (target / name).write_bytes(content)
    return target
