"""The verl adapter's settings (:class:`AdapterSettings`), read in verl's rollout processes.

Declared as the worker's are (:func:`~rewardq.settings.setting`); ``redis_url``, ``namespace`` and
``cluster`` are the worker's own declarations (:func:`~rewardq.settings.same_as`). The keys a
worker's config file may hold for the adapter alone are :data:`rewardq.config.ADAPTER_KEYS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rewardq.config import WorkerConfig
from rewardq.settings import (
    Layers,
    Setting,
    check_bounds,
    choice_of,
    env_values,
    file_value,
    same_as,
    setting,
    settings_of,
)

__all__ = ["AdapterSettings"]


@dataclass
class AdapterSettings:
    """What the verl adapter (:mod:`rewardq.integrations.verl`) reads, in verl's rollout processes.

    Lowest precedence first: the defaults, the verl config's ``rewardq`` / ``reward.rewardq``
    block (the keys below), then the ``REWARDQ_*`` environment (a variable set to "" counts as
    unset). ``redis_url``, ``namespace`` and ``cluster`` are the worker's own declarations.
    """

    redis_url: str = same_as(WorkerConfig, "redis_url")
    namespace: str = same_as(WorkerConfig, "namespace")
    cluster: bool = same_as(WorkerConfig, "cluster")
    #: Seconds the verl adapter waits for one trajectory's rewards (``REWARDQ_VERL_TIMEOUT``); past it
    #: the trajectory scores as an error (or raises, with ``REWARDQ_VERL_ON_ERROR=raise``).
    timeout: float = setting(
        900.0, "Seconds the adapter waits for one trajectory's rewards.", key="verl_timeout", above=0
    )
    #: What the verl adapter does with a trajectory that got no reward: ``mask`` leaves it out of
    #: training (no gradient, no part in its group's baseline; rewardq.integrations.verl.mask);
    #: ``zero`` scores it 0.0 with the reason in ``reward_error``; ``raise`` stops the run.
    on_error: str = setting(
        "mask",
        "What a trajectory that got no reward does to the rollout.",
        key="verl_on_error",
        choices=("mask", "zero", "raise"),
        ignore_case=True,
        bound_why="mask: the sample is left out of training (docs/verl-integration.md); "
        "zero: an error scores 0.0 and its message goes to reward_error; raise: the error stops the run",
    )
    #: The verl adapter's and hook's failure budget, counted once per run in Redis across every adapter
    #: and hook process: a failure that leaves more than this share of errors among the run's last
    #: ``VERL_ERROR_WINDOW`` trajectories stops the run (never before the window has filled, never on a
    #: scored trajectory). At a true error rate of 10 % (a flaky judge) more than 51 errors in 256 is a
    #: >5-sigma event, so a healthy run goes on; a fleet that fails everything stops within 256.
    max_error_rate: float = setting(
        0.2,
        "Failure budget: the largest share of errors among the run's last verl_error_window trajectories, "
        "counted in Redis across every adapter and hook process; more stops the run (1: never).",
        key="verl_max_error_rate",
        minimum=0,
        maximum=1,
        bound_why="a share of trajectories",
    )
    #: The largest ``verl_error_window``: the window is a ring of this many fields in one Redis hash.
    error_window: int = setting(
        256,
        "Failure budget: how many of the run's last trajectories the share of errors is taken over.",
        key="verl_error_window",
        minimum=1,
        maximum=100_000,
    )
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def settings(cls) -> dict[str, Setting]:
        """Every declared setting, by name, in declaration order."""
        return settings_of(cls)

    @classmethod
    def load(cls, block: Mapping[str, object] | None, env: Mapping[str, str]) -> AdapterSettings:
        """Defaults < ``block`` (the verl config's rewardq settings, by key) < ``env``, checked."""
        layers = Layers()
        by_key = {s.key: s for s in cls.settings().values()}
        for key, value in (block or {}).items():
            s = by_key.get(key)
            if s is not None and value is not None:
                layers.put(s, file_value(s, value, "the verl config's rewardq block"), f"rewardq config {key}")
        for name, (value, var) in env_values(cls, env, skip_empty=True).items():
            layers.put(cls.settings()[name], value, f"env {var}")
        out = cls(**layers.values)
        out.sources = dict(layers.sources)
        for name, s in cls.settings().items():
            check_bounds(s, getattr(out, name), out.sources.get(name, ""))
            if s.spec.choices:
                setattr(out, name, choice_of(s, str(getattr(out, name))))
        return out
