"""``python -m rewardq ...``: the same command line as the ``rewardq`` console script."""

from rewardq.cli import main

if __name__ == "__main__":
    main()
