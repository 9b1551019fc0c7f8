"""Without the worker extra, the command line says what to install instead of an ImportError traceback."""

from __future__ import annotations

import subprocess
import sys

from tests.support.cli_procs import REPO

# Run rewardq as if `module` were not installed (None in sys.modules makes its import fail).
WITHOUT = (
    "import sys; sys.modules[{module!r}] = None; sys.argv = ['rewardq', *{argv!r}]; "
    "from rewardq.__main__ import main; main()"
)


def run_without(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    code = WITHOUT.format(module=module, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_missing_cli_dependency_names_the_worker_extra() -> None:
    done = run_without("click", "--help")
    assert done.returncode == 2
    assert "click is not installed" in done.stderr and "pip install 'rewardq[worker]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_torch_when_a_worker_starts_names_the_worker_extra() -> None:
    done = run_without("torch", "worker", "--tokenizer", "builtin:demo", "--redis-url", "redis://127.0.0.1:1/0")
    assert done.returncode == 2, done.stderr
    assert "torch is not installed" in done.stderr and "pip install 'rewardq[worker]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_other_import_errors_are_not_disguised() -> None:
    done = run_without("rewardq.ops.status", "--help")
    assert done.returncode != 0 and "rewardq[worker]" not in done.stderr
    # the import's own error reaches the user, naming the module that failed
    assert "ModuleNotFoundError: import of rewardq.ops.status halted" in done.stderr, done.stderr
