"""Hosts for the code sandbox's tests: the interpreter where every user may read it, or not.

The tests run as root with an interpreter that may sit under a folder other users cannot enter
(pyenv under a 0700 ``/root``). A deployment that runs programs as other uids without mount
namespaces (``code_local_isolation=rlimits``) installs the interpreter where they can read it;
:func:`readable_interpreter` gives a command that world, in a mount namespace of its own: every
such closed folder becomes an empty 0755 tmpfs with the interpreter's prefixes bound back.
"""

from __future__ import annotations

import pwd
import shlex
from collections.abc import Sequence

from rewardq.reward.codeexec.harness_fs import closed_folder, interpreter_prefixes, outermost


def closed_interpreter() -> str | None:
    """The outermost folder on the way to this interpreter that other users cannot enter, or None."""
    closed = [c for c in map(closed_folder, interpreter_prefixes()) if c]
    return outermost(closed)[0] if closed else None


def readable_interpreter(argv: Sequence[str], user: pwd.struct_passwd | None = None) -> list[str]:
    """``argv`` in a private mount namespace where this interpreter is readable by every user (as
    ``user``, through ``setpriv``, when given). Needs root and util-linux."""
    prefixes = interpreter_prefixes()
    closed = outermost([c for c in map(closed_folder, prefixes) if c])
    lines = ["set -e", "stages=''"]
    for p in prefixes:
        lines.append(f'd=$(mktemp -d) && mount --bind {shlex.quote(p)} "$d" && stages="$stages $d:{p}"')
    lines += [f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(c)}" for c in closed]
    lines.append('for s in $stages; do mkdir -p "${s#*:}"; mount --move "${s%%:*}" "${s#*:}"; rmdir "${s%%:*}"; done')
    become = f"setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups -- " if user else ""
    lines.append(f'exec {become}"$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(lines), "sh", *argv]
