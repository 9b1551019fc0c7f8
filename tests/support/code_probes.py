"""Programs that show what a code sandbox lets a correct program do, and what it keeps from it.

Shared by the tests of every isolation mode (``tests/integration/test_code_modes.py``,
``tests/integration/test_code_nonroot.py``).
"""

from __future__ import annotations

#: ``assert_case`` responses (of ``tests.support.assert_cases``) run in every mode: honest ones in
#: several styles and one hack of each way to end, fake or read.
ASSERT_SUBSET = frozenset(
    {
        "add",
        "point-own-eq",
        "primes-generator",
        "add-main-and-sys-exit",
        "numpy-transpose",
        "sys-exit-before-asserts",
        "os-exit-inside-the-tested-function",
        "sigkill-itself",
        "always-equal",
        "patch-builtins-sorted",
        "caller-frame-locals",
        "read-own-file-for-asserts",
        "forge-report-and-leave",
    }
)


def import_probes(secrets: list[str], udp_port: int, head: str, tail: str) -> dict[str, tuple[str, str]]:
    """name -> (a standard-input program, the one line it prints on input ``4``): each scores 1.0 in a
    sandbox that runs a correct program, keeps the ``secrets`` (files holding the password
    ``head + tail``) unreadable and refuses UDP (to ``udp_port``)."""
    return {
        "numpy": ("import numpy as np\nn = int(input())\nprint(int(np.arange(n + 1).sum()))", "10"),
        "numpy-lazy-submodule": (
            "import numpy as np\nn = int(input())\nprint(int(np.polynomial.polynomial.polyval(n, [0, 0, 1])))",
            "16",
        ),
        "array": ("import array\nn = int(input())\nprint(sum(array.array('i', range(n + 1))))", "10"),
        "stdlib": (
            "import decimal, fractions, unicodedata, zlib, statistics, heapq, bisect\nn = int(input())\n"
            "print(int(decimal.Decimal(n) * 4) + int(fractions.Fraction(0)) + int(statistics.mean([0, 0])),"
            " unicodedata.category('a'), zlib.crc32(b'') + heapq.nsmallest(1, [0])[0] + bisect.bisect([], 0))",
            "16 Ll 0",
        ),
        "udp": (
            "import socket\nn = int(input())\ntry:\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"    s.sendto(b'leak', ('127.0.0.1', {udp_port}))\n    print('sent')\n"
            "except OSError:\n    print('refused')",
            "refused",
        ),
        "secrets": (
            f"n = int(input())\npw = {head!r} + {tail!r}\nfound = []\nfor path in {secrets!r}:\n    try:\n"
            "        with open(path) as f:\n            if pw in f.read():\n                found.append(path)\n"
            "    except OSError:\n        pass\nprint('hidden' if not found else 'leaked ' + ' '.join(found))",
            "hidden",
        ),
    }
