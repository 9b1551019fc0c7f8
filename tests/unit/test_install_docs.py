"""Every documented install that brings torch takes PyTorch's CPU build, and the pins agree.

The package registry's Linux torch is the CUDA build (torch, ~15 ``nvidia-*`` packages and triton,
about 5.5 GB); a CPU worker machine gets the CPU build only from PyTorch's CPU index. Each
``pip install`` of the ``worker`` or ``test`` extra in the install docs must either name that
index beside ``-c constraints.txt`` (whose ``torch==2.13.0`` the index serves as ``2.13.0+cpu``,
which pip prefers), follow a ``pip install torch --index-url <CPU index>`` in the same block, or say
it runs in the verl environment, whose torch is verl's. tests/integration/test_cpu_torch_install.py
runs these forms against local stand-ins of the two indexes.
"""

from __future__ import annotations

import re

from packaging.requirements import Requirement
from packaging.version import Version

from tests.support.cli_procs import REPO
from tests.support.install_docs import CPU_INDEX, PipInstall, documented


def _pin() -> str:
    pins = [line for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("torch==")]
    assert len(pins) == 1, pins
    return pins[0]


def _cpu_torch_first(cmd: PipInstall) -> bool:
    """Whether PyTorch's CPU build of torch (unpinned, or at the constraints' pin) is installed before ``cmd``."""
    return any(
        b[:2] == ["pip", "install"]
        and len(b) > 2
        and b[2] in ("torch", _pin())
        and "--index-url" in b
        and b[b.index("--index-url") + 1] == CPU_INDEX
        for b in cmd.before
    )


def _pinned_from_cpu_index(cmd: PipInstall) -> bool:
    return cmd.option("--extra-index-url") == CPU_INDEX and cmd.option("-c") == "constraints.txt"


def test_every_install_that_brings_torch_takes_the_cpu_build() -> None:
    bringing = [cmd for cmd in documented() if cmd.brings_torch]
    assert len(bringing) >= 6, [str(c) for c in bringing]  # README, verl-integration, math-scorers, ray
    wrong = [
        str(c)
        for c in bringing
        if not (_pinned_from_cpu_index(c) or _cpu_torch_first(c) or "verl environment" in c.comment)
    ]
    assert not wrong, "installs that would put the CUDA torch on a CPU machine:\n" + "\n".join(wrong)
    # both forms are shown: from a checkout (with the constraints) and from the wheel
    assert any(_cpu_torch_first(c) and c.option("-c") == "constraints.txt" for c in bringing)
    assert any(_cpu_torch_first(c) and any(w.startswith("dist/rewardq-") for w in c.words) for c in bringing)


def test_the_quick_start_installs_the_cpu_build_of_the_pinned_torch() -> None:
    quick = [c for c in documented() if c.doc == "README.md" and "test" in c.extras]
    assert quick and all(_cpu_torch_first(c) and c.option("-c") == "constraints.txt" for c in quick), quick
    (first,) = [b for b in quick[0].before if b[:2] == ["pip", "install"]]
    assert first[2] == _pin()  # the same torch the constraints pin, so the second install keeps it


def test_the_pin_is_a_torch_the_worker_extra_accepts() -> None:
    pinned = Version(_pin().removeprefix("torch=="))
    declared = re.findall(r'"(torch[<>=!~ ][^"]*)"', (REPO / "pyproject.toml").read_text())
    assert len(declared) == 1, declared  # the worker extra's
    torch = Requirement(declared[0])
    assert torch.specifier.contains(pinned) and torch.specifier.contains(Version(f"{pinned}+cpu"))


def test_the_worker_image_takes_the_cpu_build_by_default() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f'ARG TORCH_INDEX_URL="{CPU_INDEX}"' in dockerfile
    assert 'torch --index-url "$TORCH_INDEX_URL"' in dockerfile  # installed before the worker extra
    assert dockerfile.index("torch --index-url") < dockerfile.index("'.[worker]'")
