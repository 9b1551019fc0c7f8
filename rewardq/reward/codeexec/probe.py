"""What a local sandbox must show before it scores anything: that a correct program runs in it.

A sandbox that cannot run a correct program would score every correct program 0.0 and teach the
policy that right answers are wrong. So :meth:`LocalSandbox.start
<rewardq.reward.codeexec.sandbox.LocalSandbox.start>` (run by the worker at start-up) refuses,
with the fix, when

* :func:`static_refusal` finds, without running anything, that a job cannot work or would leak:
  with ``rlimits`` as root, a folder on the way to the interpreter that other users cannot enter
  (pyenv, conda or a venv under a 0700 home), or a worker secret (the Redis URL file, the config
  file) that other users can read; with ``rlimits`` as another user, a secret where Landlock lets
  the programs read, or no Landlock at all;
* the **probe program** (:func:`probe_program`), run under the exact uid, mounts, filter and
  limits a job gets, does not print what it must: it imports standard modules whose code lives
  in the library's files and C extensions (``array``, ``decimal``, ``fractions``,
  ``unicodedata``, ``zlib``, ...), numpy where this interpreter has it, reads a file of the
  standard library, and writes and reads back a file in its work dir.

Every refused code trajectory then gets an error result (failure kind ``config``) naming the fix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import unicodedata
import zlib

from rewardq.reward.codeexec.harness_fs import closed_folder, interpreter_prefixes, readable_by_others
from rewardq.reward.codeexec.harness_guard import landlock_abi

#: Every refusal that is about isolation offers these.
FIXES = (
    "run the worker as root with the capabilities listed in docs/code-execution.md (the shipped "
    "container does), configure sandbox_fusion_url, or set code_local_isolation=rlimits to accept "
    "weaker isolation"
)
_READABLE_INTERPRETER = (
    "install the interpreter where every user can read it (e.g. /usr/local or /opt; pyenv, conda or a venv "
    "under a home folder are not), use the default code_local_isolation=auto (namespaces bind the "
    "interpreter's folders read-only), or configure sandbox_fusion_url"
)

_PROBE = """import array, bisect, collections, decimal, fractions, hashlib, heapq, statistics, string, unicodedata, zlib
{numpy_import}parts = [input()]
parts.append(str(sum(array.array("i", [1, 2, 3]))))
parts.append(str(decimal.Decimal("1.1") * 3))
parts.append(str(fractions.Fraction(1, 3) + fractions.Fraction(1, 6)))
parts.append(unicodedata.name(chr(233)).replace(" ", "_"))
parts.append(hashlib.sha256(b"rewardq").hexdigest()[:8])
parts.append(str(zlib.crc32(b"rewardq")))
with open(string.__file__) as f:
    parts.append(str(len(f.read(64))))
with open("probe.txt", "w") as f:
    f.write("written")
with open("probe.txt") as f:
    parts.append(f.read())
{numpy_use}print(" ".join(parts))
"""
_NUMPY_USE = """parts.append(str(int(numpy.arange(4).sum())))
with open(numpy.__file__) as f:
    parts.append(str(len(f.read(64))))
"""


def numpy_installed() -> bool:
    """Whether this interpreter itself has numpy (under its prefixes, so the sandbox's ``python -I``
    imports it too): verl's ``prime_code`` gives a program numpy, so a sandbox must as well."""
    try:
        spec = importlib.util.find_spec("numpy")
    except (ImportError, ValueError):
        return False
    origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else ""
    return any(origin.startswith(d.rstrip("/") + "/") for d in interpreter_prefixes())


def probe_program(numpy: bool) -> tuple[str, str]:
    """The probe's source (a standard-input program, as ``prime_code`` runs it) and the one line it must print
    when its input is ``ok``."""
    source = _PROBE.format(numpy_import="import numpy\n" if numpy else "", numpy_use=_NUMPY_USE if numpy else "")
    expected = [
        "ok",
        "6",
        "3.3",
        "1/2",
        unicodedata.name(chr(233)).replace(" ", "_"),
        hashlib.sha256(b"rewardq").hexdigest()[:8],
        str(zlib.crc32(b"rewardq")),
        "64",
        "written",
    ]
    if numpy:
        expected += ["6", "64"]
    return source, " ".join(expected) + "\n"


def program_failure(error: str, isolation: str) -> str:
    """The refusal for a sandbox whose probe program failed with ``error``."""
    if isolation == "rlimits" and os.geteuid() != 0:
        fix = (
            "make sure Landlock lets the programs read the interpreter's folders "
            f"({', '.join(interpreter_prefixes())}), or configure sandbox_fusion_url"
        )
    else:
        fix = (
            "make the interpreter's folders readable by other users "
            f"(chmod -R o+rX {' '.join(interpreter_prefixes())}), or configure sandbox_fusion_url"
        )
    return (
        f"the local code sandbox refuses to run programs: a correct program fails in it ({error}), so every "
        f"correct program would score 0.0. To score code here, {fix}"
    )


def _readable_paths_refusal(secrets: tuple[str, ...], readable: list[str]) -> str:
    for secret in secrets:
        if landlock_abi() == 0:
            return (
                f"the local code sandbox refuses to run programs: the worker's secret file {secret} would be "
                "readable by them (this kernel has no Landlock, and with code_local_isolation=rlimits they run as "
                "this worker's user). To score code here, run the worker as root with the default isolation, or "
                "configure sandbox_fusion_url"
            )
        real = os.path.realpath(secret)
        inside = next((r for r in readable if real == r or real.startswith(r.rstrip("/") + "/")), None)
        if inside is not None:
            return (
                f"the local code sandbox refuses to run programs: the worker's secret file {secret} lies under "
                f"{inside}, which they may read "
                "(code_local_isolation=rlimits lets them read the interpreter's folders and the system "
                "libraries). Move it elsewhere, use the default isolation as root, or configure sandbox_fusion_url"
            )
    return ""


def static_refusal(isolation: str, secrets: tuple[str, ...], system_readable: tuple[str, ...]) -> str:
    """Why a sandbox of ``isolation`` (as this process's user) must refuse, from what is visible
    without running anything; "" when nothing is. See the module docstring."""
    if isolation != "rlimits":
        return ""  # namespaces cover every secret and bind the interpreter back, whatever the modes
    if os.geteuid() != 0:
        return _readable_paths_refusal(secrets, [*interpreter_prefixes(), *system_readable])
    for folder in interpreter_prefixes():
        closed = closed_folder(folder)
        if closed is not None:
            return (
                f"the local code sandbox refuses to run programs: they run as a uid of their own, which cannot "
                f"read the interpreter's library ({closed} is closed to other users, mode "
                f"{os.stat(closed).st_mode & 0o777:04o}), so every correct program would score 0.0. To score "
                f"code here, {_READABLE_INTERPRETER}"
            )
    for secret in secrets:
        if readable_by_others(secret):
            return (
                f"the local code sandbox refuses to run programs: the worker's secret file {secret} is readable by "
                f"other users (mode {os.stat(secret).st_mode & 0o777:04o}), so a program (run as a uid of its own "
                f"with code_local_isolation=rlimits) could read it. To score code here, chmod 600 {secret}, use "
                "the default code_local_isolation=auto (namespaces cover it), or configure sandbox_fusion_url"
            )
    return ""
