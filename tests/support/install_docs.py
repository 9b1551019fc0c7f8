"""The commands and config blocks the docs show, read from their code blocks.

Used by ``tests/unit/test_install_docs.py`` (every install of torch-bringing extras takes PyTorch's
CPU build) and ``tests/integration/test_cpu_torch_install.py`` (the documented forms, run against
local stand-ins of the two package indexes).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tests.support.cli_procs import REPO

#: PyTorch's own index of CPU builds (``torch==2.13.0`` there is ``2.13.0+cpu``).
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The docs that tell a user how to install rewardq.
INSTALL_DOCS = ["README.md", "docs/verl-integration.md", "docs/math-scorers.md", "docs/ray.md"]
#: Extras that bring torch (``test`` includes ``worker``).
TORCH_EXTRAS = {"worker", "test"}

_BLOCK = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class PipInstall:
    """One ``pip install`` as documented: its words, its comment, and the block's earlier commands."""

    doc: str
    words: list[str]
    comment: str
    before: list[list[str]]

    @property
    def extras(self) -> set[str]:
        found: set[str] = set()
        for w in self.words:
            m = re.search(r"\[([^\]]*)\]$", w)
            if m and not w.startswith("-"):
                found |= {e.strip() for e in m.group(1).split(",")}
        return found

    @property
    def brings_torch(self) -> bool:
        return bool(self.extras & TORCH_EXTRAS)

    def option(self, name: str) -> str | None:
        """The value of ``--name VALUE`` (or ``-c VALUE``), if given."""
        for i, w in enumerate(self.words[:-1]):
            if w == name:
                return self.words[i + 1]
        return None

    def __str__(self) -> str:
        return f"{self.doc}: {shlex.join(self.words)}"


def _logical_lines(block: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def pip_installs(doc: str) -> list[PipInstall]:
    """Every ``pip install`` in the shell code blocks of ``doc`` (a path relative to the repository)."""
    found: list[PipInstall] = []
    for block in _BLOCK.findall((REPO / doc).read_text()):
        before: list[list[str]] = []
        for line in _logical_lines(block):
            code, _, comment = line.partition(" #")
            if code.lstrip().startswith("#"):
                continue
            for part in code.split("&&"):
                words = shlex.split(part)
                if words[:2] == ["pip", "install"]:
                    found.append(PipInstall(doc, words, comment.strip(), [list(b) for b in before]))
                if words:
                    before.append(words)
    return found


def documented() -> list[PipInstall]:
    """The ``pip install`` commands of every install doc."""
    return [cmd for doc in INSTALL_DOCS for cmd in pip_installs(doc)]


def shell_commands(doc: str) -> list[list[str]]:
    """Every command (its words) of the shell code blocks of ``doc``, comments left out."""
    found: list[list[str]] = []
    for block in _BLOCK.findall((REPO / doc).read_text()):
        for line in _logical_lines(block):
            code = line.partition(" #")[0]
            if code.lstrip().startswith("#"):
                continue
            found += [words for part in code.split("&&") if (words := shlex.split(part))]
    return found


def yaml_blocks(doc: str) -> list[str]:
    """The YAML code blocks of ``doc``."""
    return re.findall(r"```yaml\n(.*?)```", (REPO / doc).read_text(), re.DOTALL)
