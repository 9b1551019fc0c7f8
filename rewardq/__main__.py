"""``python -m rewardq ...``: the same command line as the ``rewardq`` console script."""

from rewardq.entry import main

if __name__ == "__main__":
    main()
