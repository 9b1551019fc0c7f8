"""What a sandboxed program may ask the kernel for: a seccomp filter (every mode) and a
Landlock domain (``rlimits`` mode), applied by the runner after it dropped its privileges and
set ``no_new_privs``, before any of the program runs.

Loaded by path from :mod:`.harness` (standard library and ``ctypes`` only, never rewardq).

**The syscall filter** is built with libseccomp (``libseccomp.so.2``, Debian's
``libseccomp2``, already on every host that has systemd or apt), called through ``ctypes``:
libseccomp is the kept library that knows each architecture's syscall numbers, kills a
process that switches to another syscall ABI (``int 0x80`` on x86-64), and compiles the BPF.
Debian's ``python3-seccomp`` binds the same library but only for Debian's own interpreter
(not a virtualenv's, not the ``python`` image's); the PyPI bindings are unmaintained. The
filter denies, with ``EPERM`` unless said otherwise:

* keyrings: ``add_key``, ``request_key``, ``keyctl`` (no key a job leaves can reach the next);
* namespaces: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag, ``clone3``
  (``ENOSYS``: its flags are behind a pointer, and glibc then falls back to ``clone``), so
  no user namespace (and no capability inside one) can be made;
* mounts: ``mount``, ``umount2``, ``pivot_root`` and the new mount API;
* Unix sockets: ``socket(AF_UNIX | AF_NETLINK | AF_VSOCK, ...)`` and datagram
  ``socketpair(AF_UNIX)`` (``sendto`` from one reaches any socket path); a connected stream
  pair, which reaches nothing, stays allowed (``asyncio`` needs one);
* every IPv4 and IPv6 socket but a TCP stream (UDP, raw, SCTP, ...) and TCP Fast Open
  (``MSG_FASTOPEN``, a connection made by ``sendto``): Landlock (``rlimits`` as another user)
  governs TCP ``connect`` and ``bind`` only, so without this a program could send UDP
  datagrams anywhere;
* ``io_uring_*`` (its operations bypass this filter), ``ptrace``, ``process_vm_readv``,
  ``process_vm_writev``, ``pidfd_getfd``, ``bpf``, ``perf_event_open``, ``userfaultfd``.

**Landlock** (``rlimits`` mode, when the kernel has it; Linux 5.13+): the program may read
only the interpreter's folders and the system libraries, write only its work dir, and (by
ABI version) connect or bind no TCP port (4+), signal no process outside its run and reach
no abstract Unix socket (6+). It also cannot ptrace anything outside its run (every
version). So the worker's files, ``/proc`` (every process's command line and environment)
and the Redis URL file are out of its reach although it runs as the worker's user.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

# -- seccomp ----------------------------------------------------------------------------------
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 4, 7
CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_VSOCK = 1, 2, 10, 16, 40
SOCK_DGRAM, SOCK_TYPE_MASK = 2, 0xF
#: Socket types of IPv4/IPv6 a program may not create: all but SOCK_STREAM (1).
INET_DENIED_TYPES = (2, 3, 4, 5, 10)  # DGRAM, RAW, RDM, SEQPACKET, PACKET
MSG_FASTOPEN = 0x20000000

DENIED = (
    "add_key request_key keyctl unshare setns mount umount2 pivot_root open_tree move_mount fsopen "
    "fsconfig fsmount fspick mount_setattr io_uring_setup io_uring_enter io_uring_register ptrace "
    "process_vm_readv process_vm_writev pidfd_getfd bpf perf_event_open userfaultfd"
).split()
NOT_IMPLEMENTED = ("clone3",)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


class SyscallFilter:
    """The filter above, compiled once by the supervisor; :meth:`load` applies it to the
    calling process (after ``no_new_privs``) and, through ``fork``, to all it starts.

    Raises:
        OSError: libseccomp is missing or refuses a rule (the sandbox cannot be built).
    """

    def __init__(self) -> None:
        name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            raise OSError(
                errno.ENOENT, "libseccomp is not installed (Debian/Ubuntu: apt-get install libseccomp2)"
            ) from None
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        ]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        self._lib = lib
        self._ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
        if not self._ctx:
            raise OSError(errno.ENOMEM, "seccomp_init failed")
        eperm = _errno_action(errno.EPERM)
        for name in DENIED:
            self._rule(name, eperm)
        for name in NOT_IMPLEMENTED:
            self._rule(name, _errno_action(errno.ENOSYS))
        for flag in CLONE_NEW_FLAGS.values():
            self._rule("clone", eperm, (0, SCMP_CMP_MASKED_EQ, flag, flag))
        for family in (AF_UNIX, AF_NETLINK, AF_VSOCK):
            self._rule("socket", _errno_action(errno.EAFNOSUPPORT), (0, SCMP_CMP_EQ, family, 0))
        self._rule(
            "socketpair", eperm, (0, SCMP_CMP_EQ, AF_UNIX, 0), (1, SCMP_CMP_MASKED_EQ, SOCK_TYPE_MASK, SOCK_DGRAM)
        )
        for family in (AF_INET, AF_INET6):
            for kind in INET_DENIED_TYPES:
                self._rule("socket", eperm, (0, SCMP_CMP_EQ, family, 0), (1, SCMP_CMP_MASKED_EQ, SOCK_TYPE_MASK, kind))
        for call, flags_arg in (("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3)):
            self._rule(call, eperm, (flags_arg, SCMP_CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN))

    def _rule(self, syscall: str, action: int, *cmps: tuple[int, int, int, int]) -> None:
        nr = self._lib.seccomp_syscall_resolve_name(syscall.encode())
        if nr < 0:  # __NR_SCMP_ERROR: this architecture has no such call (nothing to deny)
            return
        array = (_ArgCmp * max(1, len(cmps)))(*(_ArgCmp(*c) for c in cmps))
        rc = self._lib.seccomp_rule_add_array(self._ctx, action, nr, len(cmps), array)
        if rc < 0:
            raise OSError(-rc, f"seccomp rule for {syscall}: {os.strerror(-rc)}")

    def deny_self_signals(self, pid: int) -> None:
        """Make a signal this process (``pid``) sends itself, or its process group, kill it with
        SIGSYS instead (``kill``, ``tkill``, ``tgkill``, ``rt_*sigqueueinfo``: ``os.kill``,
        ``signal.raise_signal``, ``os.abort``), so the supervisor can tell such a death from any
        other; a ``pidfd`` of itself is refused. For ``assert_case`` runs, where ending the run
        early is a hack (``early_exit``)."""
        low = 0xFFFFFFFF  # pid_t is 32 bits: compare only those of the register
        kill_process = 0x80000000  # SCMP_ACT_KILL_PROCESS
        for call in ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
            self._rule(call, kill_process, (0, SCMP_CMP_MASKED_EQ, low, pid))
        for target in (0, -pid & low):  # its own process group
            self._rule("kill", kill_process, (0, SCMP_CMP_MASKED_EQ, low, target))
        self._rule("pidfd_open", _errno_action(errno.EPERM), (0, SCMP_CMP_MASKED_EQ, low, pid))

    def load(self) -> None:
        rc = self._lib.seccomp_load(self._ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")


# -- Landlock ---------------------------------------------------------------------------------
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_READ = (1 << 0) | (1 << 2) | (1 << 3)  # EXECUTE, READ_FILE, READ_DIR
_FS_BITS_BY_ABI = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}  # how many access bits each ABI knows
_NET_ALL = 0b11  # BIND_TCP, CONNECT_TCP (ABI 4+)
_SCOPE_ALL = 0b11  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6+)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or it is disabled at boot)."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _call(nr: int, *args: object) -> int:
    rc = int(_libc.syscall(nr, *args))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock syscall {nr}: {os.strerror(err)}")
    return rc


def restrict_paths(readable: list[str], writable: list[str]) -> int:
    """Confine the calling process (and all it starts) as the module docstring says; returns
    the ABI version applied (0: the kernel has no Landlock, nothing was applied)."""
    abi = landlock_abi()
    if abi == 0:
        return 0
    fs_all = (1 << _FS_BITS_BY_ABI.get(abi, 16)) - 1
    attr = (ctypes.c_uint64 * 3)(fs_all, _NET_ALL if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _call(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for paths, access in ((readable, _READ), (writable, fs_all)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # not on this host: nothing to allow
                try:
                    # a file (not a folder) may only be given the rights that apply to files
                    allowed = access if os.path.isdir(path) else access & ((1 << 0) | (1 << 1) | (1 << 2) | (1 << 14))
                    rule = _PathBeneath(allowed & fs_all, fd)
                    _call(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0))
                finally:
                    os.close(fd)
        _call(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return abi
