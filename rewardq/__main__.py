"""The ``rewardq`` console script and ``python -m rewardq``: the command line of :mod:`rewardq.cli`.

Without the ``worker`` extra the CLI's own imports fail; that ends in one line naming
``pip install 'rewardq[worker]'`` and exit code 2, not a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the CLI; report a missing worker dependency as one line and exit 2."""
    from rewardq.install import missing_worker_module

    try:
        from rewardq.cli import main as cli_main
    except ModuleNotFoundError as exc:
        module = missing_worker_module(exc)
        if module is None:
            raise
        from rewardq.errors import MissingExtra

        sys.stderr.write(f"error: {MissingExtra(module)}\n")
        sys.exit(2)
    cli_main()


if __name__ == "__main__":
    main()
