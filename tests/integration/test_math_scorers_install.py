"""The built-in math scorers without the math extra, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def test_the_scorers_load_without_the_math_extra() -> None:
    # a worker without the extra (sympy comes with torch) starts, scores every other data source,
    # and a numina sample raises the error that becomes its error result
    code = (
        "import sys\n"
        "for m in ('pylatexenc', 'mathruler', 'math_verify'): sys.modules[m] = None\n"
        "from rewardq.reward.scoring import default_compute_score, placement_of\n"
        "import rewardq.consumers.worker\n"
        "assert placement_of('numina_olympiads') == 'process'\n"
        "print(default_compute_score('openai/gsm8k', '#### 3', '3'))\n"
        "try:\n"
        "    default_compute_score('numina_olympiads', '3', '3')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1.0",
        "MissingScorerExtra the numina (prime_math) scorer needs the 'pylatexenc' package, which is not "
        "installed: pip install 'rewardq[math]'",
    ]
