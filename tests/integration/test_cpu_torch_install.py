"""The documented installs give a CPU machine PyTorch's CPU build, run with pip against stand-in indexes.

No download: two local PEP 503 indexes stand in for the package registry and PyPI's CPU index of
PyTorch. The "registry" serves ``torch 2.13.0`` depending on ``nvidia-cublas-cu12`` (as the
registry's Linux wheel depends on ~15 ``nvidia-*`` packages), the "CPU index" serves ``torch
2.13.0+cpu``; a stand-in rewardq wheel declares the worker extra's torch requirement. Each
documented form, read from the docs (tests/support/install_docs.py), runs in a fresh venv with
only the two URLs and the install target swapped for the stand-ins: the CPU build is installed and
no ``nvidia-*`` package; the same install without the CPU index gets the "CUDA" build, so the
stand-ins do reproduce the problem.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.cli_procs import REPO
from tests.support.install_docs import CPU_INDEX, PipInstall, documented

pytestmark = pytest.mark.slow

CHECKOUT_TARGETS = {"-e", ".[worker]", ".[test]", ".[worker,math]", ".[worker,ray]"}


def _torch_requirement() -> str:
    (declared,) = re.findall(r'"(torch[<>=!~ ][^"]*)"', (REPO / "pyproject.toml").read_text())
    return str(declared)


def _wheel(folder: Path, name: str, version: str, requires: list[str], extras: dict[str, list[str]]) -> Path:
    """A minimal pure-Python wheel with the given metadata (one empty module)."""
    dist = name.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in extras.items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    files = {
        f"{dist}_standin.py": "",
        f"{dist}-{version}.dist-info/METADATA": "\n".join(meta) + "\n",
        f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for arc, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}-{version}.dist-info/RECORD,,")
    files[f"{dist}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
    return path


def _index(root: Path, wheels: dict[str, list[Path]]) -> str:
    """A PEP 503 "simple" index of ``wheels`` (project name -> files) under ``root``; its file URL."""
    for project, files in wheels.items():
        d = root / project
        d.mkdir(parents=True)
        links = "".join(f'<a href="{f.name}">{f.name}</a>\n' for f in files)
        for f in files:
            (d / f.name).write_bytes(f.read_bytes())
        (d / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root.as_uri()


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    """(registry URL, CPU index URL, the stand-in rewardq wheel)."""
    tmp = tmp_path_factory.mktemp("indexes")
    built = tmp / "built"
    built.mkdir()
    cuda = _wheel(built, "torch", "2.13.0", ["nvidia-cublas-cu12"], {})
    nvidia = _wheel(built, "nvidia-cublas-cu12", "12.9.1", [], {})
    cpu = _wheel(built, "torch", "2.13.0+cpu", [], {})
    extras = {"worker": [_torch_requirement()], "test": [_torch_requirement()], "math": [], "ray": []}
    rewardq = _wheel(tmp, "rewardq", "0.1.0", [], extras)
    registry = _index(tmp / "registry", {"torch": [cuda], "nvidia-cublas-cu12": [nvidia]})
    cpu_index = _index(tmp / "cpu", {"torch": [cpu]})
    return registry, cpu_index, rewardq


def _standin_args(cmd: PipInstall, registry: str, cpu_index: str, rewardq: Path) -> list[str]:
    """The documented command's arguments with the URLs and the install target swapped for stand-ins;
    the registry is the index unless the command names its own (``--index-url <CPU index>``)."""
    args: list[str] = []
    for w in cmd.words[2:]:
        if w == CPU_INDEX:
            args.append(cpu_index)
        elif w == "constraints.txt":
            args.append(str(REPO / "constraints.txt"))
        elif w in CHECKOUT_TARGETS or w.startswith("dist/rewardq-"):
            if w != "-e":  # the stand-in is a wheel, not an editable checkout
                args.append(f"{rewardq}{w[w.index('[') :] if '[' in w else ''}")
        else:
            args.append(w)
    return args if "--index-url" in args else ["--index-url", registry, *args]


def _venv(tmp: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True, timeout=120)
    return tmp / "venv" / "bin" / "python"


def _pip(python: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """This pip, installing into ``python``'s venv, with no configuration but the command line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _installed(python: Path) -> dict[str, str]:
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m; print('\\n'.join(d.name + ' ' + d.version for d in m.distributions()))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def _sequence(cmd: PipInstall) -> list[PipInstall]:
    """The documented command and the ``pip install torch...`` before it in its block, in order."""
    first = [PipInstall(cmd.doc, b, "", []) for b in cmd.before if b[:2] == ["pip", "install"] and "--index-url" in b]
    return [*first[-1:], cmd]


def _forms() -> dict[str, PipInstall]:
    """Each form of install: the README's quick start (CPU torch first, then the checkout with its
    constraints), the wheel's (CPU torch first), and .ci/run's (the CPU index beside the constraints)."""
    bringing = [c for c in documented() if c.brings_torch and "verl environment" not in c.comment]
    first = [c for c in bringing if len(_sequence(c)) == 2]
    checkout = next(c for c in first if c.doc == "README.md" and c.option("-c") == "constraints.txt")
    wheel = next(c for c in first if any(w.startswith("dist/rewardq-") for w in c.words))
    ci = (REPO / ".ci" / "run").read_text()
    assert f"TORCH_CPU_INDEX={CPU_INDEX}" in ci and 'CPU_TORCH=(--extra-index-url "$TORCH_CPU_INDEX")' in ci
    words = ["pip", "install", "--extra-index-url", CPU_INDEX, "-c", "constraints.txt", ".[test]"]
    return {"checkout": checkout, "wheel": wheel, "extra-index": PipInstall(".ci/run", words, "", [])}


@pytest.mark.parametrize("form", ["checkout", "wheel", "extra-index"])
def test_the_documented_install_gets_the_cpu_build(form: str, indexes: tuple[str, str, Path], tmp_path: Path) -> None:
    registry, cpu_index, rewardq = indexes
    python = _venv(tmp_path)
    for cmd in _sequence(_forms()[form]):
        run = _pip(python, _standin_args(cmd, registry, cpu_index, rewardq))
        assert run.returncode == 0, (str(cmd), run.stderr[-2000:])
    installed = _installed(python)
    assert installed.get("torch") == "2.13.0+cpu", installed
    assert not any(name.startswith("nvidia") for name in installed), installed
    assert "rewardq" in installed


def test_without_the_cpu_index_the_registry_gives_the_cuda_build(
    indexes: tuple[str, str, Path], tmp_path: Path
) -> None:
    registry, _, rewardq = indexes
    python = _venv(tmp_path)
    run = _pip(python, ["--index-url", registry, "-c", str(REPO / "constraints.txt"), f"{rewardq}[worker]"])
    assert run.returncode == 0, run.stderr[-2000:]
    installed = _installed(python)
    assert installed.get("torch") == "2.13.0" and "nvidia-cublas-cu12" in installed, installed
