"""verl's own reward loop beside rewardq (see :mod:`benchmarks.verl_loop.__main__`)."""
