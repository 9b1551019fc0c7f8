"""rewardq's verl plugin: ``reward.reward_manager.name=rewardq`` switches a verl run to the rewardq fleet.

verl 0.9.1 loads every entry point of the group ``verl.plugins`` when it is imported (``import
verl``; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns that off), in the trainer's process and in every
Ray actor it starts. rewardq's wheel declares this module there (``pyproject.toml``), so wherever
rewardq is installed beside verl, :class:`RewardqReward` is in verl's reward-manager registry under
the name ``rewardq`` whenever verl looks a name up: verl's default ``reward.reward_manager.source:
register`` finds it, with no ``source`` or ``module.path`` override.

Registering needs verl's reward-manager package, which imports all of verl's managers (about 1.5 s
of CPU, measured), and many verl processes never load it (rollout and training workers). So the
plugin registers the name right after verl imports that package, wherever it does (a finder on
``sys.meta_path`` adds the registration to the package's own import), and importing verl costs only
this module. Building a :class:`RewardqReward` builds rewardq's hook,
:class:`rewardq.integrations.verl.RewardqRewardManager`, whose module imports verl's agent loop and
Ray, in the processes where verl builds a reward manager.

verl swallows an exception raised by a plugin (it logs it at DEBUG), which would leave the name
unknown with no reason given; so a failure to register is logged as a warning naming the cause and
the override that works without the plugin (the ``importlib`` triple of docs/verl-integration.md).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from rewardq.verl_config import HOOK_CLASS, HOOK_MODULE, HOOK_NAME

__all__ = ["register", "reward_class"]  # and RewardqReward, built on first access

logger = logging.getLogger("rewardq.integrations.verl.plugin")

#: verl's reward-manager package: importing it imports its registry and every verl manager.
REGISTRY_PACKAGE = "verl.experimental.reward_loop.reward_manager"


@functools.cache
def reward_class() -> type:
    """:class:`RewardqReward`, a subclass of verl's ``RewardManagerBase`` (built once, on first use)."""
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

    class RewardqReward(RewardManagerBase):  # type: ignore[misc]  # verl ships no types
        """verl's reward manager ``rewardq``: verl builds it as ``cls(config, tokenizer, compute_score,
        ...)``, which returns rewardq's hook built with those arguments. verl's class methods
        (``assemble_rm_scores``) are the hook's too: it does not override them."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            from rewardq.integrations.verl import RewardqRewardManager

            return RewardqRewardManager(*args, **kwargs)

    RewardqReward.__module__, RewardqReward.__qualname__ = __name__, "RewardqReward"  # pickled by name
    return RewardqReward


def __getattr__(name: str) -> object:
    """``RewardqReward`` as a module attribute (what a pickle of the class names)."""
    if name == "RewardqReward":
        return reward_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register :class:`RewardqReward` as verl's reward manager ``rewardq`` (again: a no-op)."""
    try:
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER, register

        if HOOK_NAME not in REWARD_MANAGER:  # verl refuses a second class under one name
            register(HOOK_NAME)(reward_class())
    except Exception as exc:
        logger.warning(
            "rewardq could not register its verl reward manager %r (%s: %s), so reward.reward_manager.name=%s "
            "is unknown to verl; without the plugin use reward.reward_manager.source=importlib "
            "reward.reward_manager.module.path=pkg://%s reward.reward_manager.name=%s",
            HOOK_NAME,
            type(exc).__name__,
            exc,
            HOOK_NAME,
            HOOK_MODULE,
            HOOK_CLASS,
        )
        raise


class RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds :data:`REGISTRY_PACKAGE` as the other finders do, and calls :func:`register` once its
    code has run; then leaves ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != REGISTRY_PACKAGE:
            return None
        sys.meta_path.remove(self)  # the one import it waits for: the other finders answer from here on
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            register()

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this module's own loader
        return spec


if REGISTRY_PACKAGE in sys.modules:
    register()
elif not any(isinstance(f, RegisterAfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, RegisterAfterImport())
