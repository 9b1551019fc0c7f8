"""Read verl's own trainer config as verl reads it, and turn it into rewardq worker settings.

``rewardq worker --config FILE`` accepts verl's complete trainer config (the generated
``verl/trainer/config/_generated_ppo_trainer.yaml``, or a Hydra-dumped ``config.yaml`` of a
run). What rewardq reads from it::

    reward.reward_manager.name                   -> manager (naive, dapo, gdpo, rate_limited, remote);
                                                    rewardq (the hook, registered by rewardq's verl
                                                    plugin) -> reward.rewardq.manager, default naive
    reward.reward_manager.source: importlib      -> manager = the class ``reward_manager.name`` from
        + module.path (file or pkg://) / module.name   that file or module (a rewardq RewardManager);
                                                    rewardq's own hook (pkg://rewardq.integrations.verl,
                                                    RewardqRewardManager) -> reward.rewardq.manager,
                                                    default naive
    reward.custom_reward_function.path/.name     -> reward_fn (name defaults to compute_score)
    reward.custom_reward_function.reward_kwargs  -> reward_fn_kwargs
    reward.reward_kwargs                         -> manager options (overlong_buffer_cfg -> overlong_buffer)
    reward.max_concurrent/max_rpm/max_tpm/estimated_tokens_per_request/timeout -> manager options
    reward.num_workers                           -> manager option num_workers (the remote manager's pool)
    reward.sandbox_fusion.url/.max_concurrent/.memory_limit_mb (when url is set)
                                                 -> sandbox_fusion_url/_max_concurrent/_memory_limit_mb
    reward.reward_model.enable (no custom fn)    -> manager disrm; model_path -> model and tokenizer,
                                                    rollout.name -> backend (base_url: a rewardq option)
    reward.reward_model.model_path (genrm)       -> the judge's model, with reward_manager.name: genrm
    trainer.experiment_name                      -> manager option experiment_name (gdpo)
    actor_rollout_ref.model.tokenizer_path, else actor_rollout_ref.model.path
                                                 -> tokenizer (a local folder or a Hub id, loaded as
                                                    verl loads it; see rewardq.reward.tokenizer)
    reward.rewardq / rewardq / top-level keys    -> WorkerConfig fields, as in a rewardq config

The legacy layout (top-level ``reward_model:``, ``custom_reward_function:``, ``sandbox_fusion:``,
``reward_model.reward_kwargs``) is first migrated onto ``reward:`` exactly as verl's
``migrate_legacy_reward_impl`` does. OmegaConf interpolations of the form ``${a.b}`` and
``${oc.select:a.b,default}`` are resolved against the file; ``???`` (a required value left
unset) reads as unset. Keys of the ``reward:`` block rewardq does not use are reported, once,
in :attr:`VerlTranslation.unused`; nothing here raises for a key it does not know.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardq.errors import ConfigError

#: Top-level sections of verl 0.9.1's trainer configs (none of them is a rewardq setting): the
#: generated ``_generated_ppo_*trainer.yaml`` files, what Hydra composes from ``ppo_trainer`` (which
#: adds the ``model_engine`` group) and from the one-step-off and fully-async trainers' configs
#: (``rollout``, ``async_training``), and the ``defaults`` list of an uncomposed file.
#: tests/verl/test_verl_config_keys.py derives the set from verl's own files and checks it is here.
VERL_SECTIONS = frozenset(
    {
        "actor_rollout_ref",
        "algorithm",
        "async_training",
        "critic",
        "custom_reward_function",
        "data",
        "defaults",
        "distillation",
        "global_profiler",
        "hydra",
        "model_engine",
        "ray_kwargs",
        "ray_init",
        "reward",
        "reward_model",
        "rollout",
        "sandbox_fusion",
        "skip",
        "trainer",
        "transfer_queue",
    }
)
#: ``reward.*`` values verl's reward loop passes straight to its managers' options.
REWARD_LOOP_OPTIONS = ("max_concurrent", "max_rpm", "max_tpm", "estimated_tokens_per_request", "timeout", "num_workers")
#: verl's ``reward.sandbox_fusion`` keys -> rewardq manager options.
SANDBOX_OPTIONS = {
    "url": "sandbox_fusion_url",
    "max_concurrent": "sandbox_fusion_max_concurrent",
    "memory_limit_mb": "sandbox_fusion_memory_limit_mb",
}
#: Where verl finds the policy's tokenizer, first match wins (``hf_tokenizer(tokenizer_path or path)``).
POLICY_TOKENIZER_KEYS = ("actor_rollout_ref.model.tokenizer_path", "actor_rollout_ref.model.path")
_MISSING = "???"
_INTERPOLATION = re.compile(r"^\$\{(?:oc\.select:)?([^,}]+)(?:,([^}]*))?\}$")


def is_verl_config(data: Mapping[str, object]) -> bool:
    """True when a config file looks like verl's (it has a ``reward:`` block or another verl section)."""
    return isinstance(data.get("reward"), Mapping) or any(
        isinstance(data.get(s), Mapping) for s in VERL_SECTIONS - {"hydra"}
    )


@dataclass
class VerlTranslation:
    """What a verl config means for a rewardq worker.

    Attributes:
        values: WorkerConfig fields (lowest precedence among the file's contents).
        unused: dotted paths of ``reward:`` keys that were set but rewardq does not use.
        origins: the verl key each value came from, where naming it helps an error
            (``{"tokenizer": "actor_rollout_ref.model.path"}``).
    """

    values: dict[str, Any] = field(default_factory=dict)
    unused: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)


class _Reader:
    """Reads dotted paths from the config, resolving interpolations and remembering what was read."""

    def __init__(self, root: Mapping[str, object]) -> None:
        self.root = root
        self.read: set[str] = set()

    def raw(self, path: str) -> object:
        node: object = self.root
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    def get(self, path: str, default: object = None, _depth: int = 0) -> Any:
        self.read.add(path)
        value = self.raw(path)
        if isinstance(value, str):
            if value == _MISSING:
                return default
            m = _INTERPOLATION.match(value.strip())
            if m and _depth < 8:
                target, fallback = m.group(1).strip(), m.group(2)
                resolved = self.get(target, None, _depth + 1)
                if resolved is None and fallback is not None:
                    fallback = fallback.strip()
                    return None if fallback in ("null", "") else fallback
                return resolved
        return default if value is None else value


def migrate_legacy(data: Mapping[str, Any]) -> dict[str, Any]:
    """verl's ``migrate_legacy_reward_impl`` on a plain dict: legacy sections move onto ``reward:``."""
    cfg = copy.deepcopy(dict(data))
    legacy = {k: cfg.get(k) for k in ("reward_model", "custom_reward_function", "sandbox_fusion")}
    if not any(isinstance(x, Mapping) for x in legacy.values()) or not isinstance(cfg.setdefault("reward", {}), dict):
        return cfg
    reward = cfg["reward"]
    rm = dict(legacy["reward_model"]) if isinstance(legacy["reward_model"], Mapping) else {}
    _migrate_manager(rm, reward)
    for section in ("custom_reward_function", "sandbox_fusion"):
        old = legacy[section]
        if isinstance(old, Mapping) and not all(v is None for v in old.values()):
            reward[section] = dict(old)
    new_rm = _sub(reward, "reward_model")
    for key in ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes"):
        if rm.get(key) is not None:
            new_rm[key] = rm[key]
    model = rm.get("model")
    if isinstance(model, Mapping) and model.get("path") is not None:
        new_rm["model_path"] = model["path"]
    if rm.get("reward_kwargs") is not None:
        reward["reward_kwargs"] = rm["reward_kwargs"]
    rollout = rm.get("rollout")
    if isinstance(rollout, Mapping):
        _sub(new_rm, "rollout").update({k: v for k, v in rollout.items() if v is not None})
    for key in legacy:
        cfg.pop(key, None)
    return cfg


def _sub(d: dict[str, object], key: str) -> dict[str, object]:
    child = d.get(key)
    if not isinstance(child, dict):
        child = d[key] = {}
    return child


def _migrate_manager(rm: Mapping[str, object], reward: dict[str, object]) -> None:
    if rm.get("num_workers") is not None:
        reward["num_workers"] = rm["num_workers"]
    if rm.get("reward_manager") is not None:
        _sub(reward, "reward_manager")["name"] = rm["reward_manager"]
    if rm.get("reward_loop_source") is not None:
        manager = _sub(reward, "reward_manager")
        manager["source"] = rm["reward_loop_source"]
        module = _sub(manager, "module")
        module["path"] = rm.get("reward_loop_module_path")
        module["name"] = rm.get("reward_loop_class_name")


def translate(data: Mapping[str, object]) -> VerlTranslation:
    """The WorkerConfig values a verl trainer config implies (see the module docstring)."""
    r = _Reader(migrate_legacy(data))
    out: dict[str, Any] = {}
    opts: dict[str, Any] = {}
    _manager(r, out)
    _reward_function(r, out)
    _reward_kwargs(r, opts)
    for key in REWARD_LOOP_OPTIONS:
        value = r.get(f"reward.{key}")
        if value is not None:
            opts[key] = value
    sandbox_on = bool(r.get("reward.sandbox_fusion.url"))
    r.get("reward.sandbox_fusion")  # without a url, verl runs no sandbox and reads none of it
    for key, option in SANDBOX_OPTIONS.items():
        value = r.get(f"reward.sandbox_fusion.{key}")
        if sandbox_on and value is not None:
            opts[option] = value
    if out.get("manager") == "genrm":
        _genrm_model(r, opts)
    elif r.get("reward.reward_model.enable") is not True:
        r.get("reward.reward_model")  # a disabled reward model: verl reads none of it either
    elif not out.get("reward_fn"):
        out["manager"] = "disrm"
        model_path = r.get("reward.reward_model.model_path")
        if model_path:
            opts["model"] = model_path
            opts["tokenizer"] = model_path
        backend = r.get("reward.reward_model.rollout.name")
        if backend:
            opts["backend"] = backend
    experiment = r.get("trainer.experiment_name")
    if isinstance(experiment, str) and experiment:
        opts["experiment_name"] = experiment
    origins: dict[str, str] = {}
    for key in POLICY_TOKENIZER_KEYS:  # as verl's workers load it: tokenizer_path, else the model itself
        tokenizer = r.get(key)
        if isinstance(tokenizer, str) and tokenizer.strip():
            out["tokenizer"], origins["tokenizer"] = tokenizer.strip(), key
            break
    if opts:
        out["manager_options"] = opts
    r.read.add("reward.rewardq")  # rewardq's own settings: read by rewardq.config_file
    reward = r.raw("reward")
    unused = _unused(reward, "reward", r.read) if isinstance(reward, Mapping) else []
    return VerlTranslation(out, unused, origins)


def translate_verl_reward(reward: Mapping[str, object]) -> dict[str, Any]:
    """Map a verl ``reward:`` block alone onto WorkerConfig fields."""
    return translate({"reward": dict(reward)}).values


def _genrm_model(r: _Reader, opts: dict[str, object]) -> None:
    """The ``genrm`` judge's model is verl's reward model (``reward.reward_model.model_path``, the
    name vLLM serves it under by default), enabled or not: rewardq's judge is served outside the
    trainer, so verl's ``enable`` (start reward-model servers in the trainer) does not apply."""
    r.get("reward.reward_model")
    model_path = r.get("reward.reward_model.model_path")
    if model_path:
        opts.setdefault("model", model_path)


def _manager(r: _Reader, out: dict[str, object]) -> None:
    name = r.get("reward.reward_manager.name")
    if isinstance(r.raw("reward.reward_manager"), str):  # a plain string in hand-written configs
        name = r.get("reward.reward_manager")
    source = r.get("reward.reward_manager.source", "register")
    r.get("reward.reward_manager.module")  # verl reads it only with source: importlib, and so do we
    if source == "importlib":
        path = r.get("reward.reward_manager.module.path")
        module = r.get("reward.reward_manager.module.name")
        if is_rewardq_hook(name, path, module):
            out["manager"] = "naive"  # verl's reward loop forwards to the fleet; reward.rewardq.manager picks one
        elif isinstance(path, str) and path.startswith("pkg://"):
            out["manager"] = f"{path[len('pkg://') :].replace('/', '.')}:{name}"
        elif isinstance(path, str) and path:
            out["manager"] = f"{path.removeprefix('file://')}:{name}"
        elif isinstance(module, str) and module:
            out["manager"] = f"{module}:{name}"
        else:
            raise ConfigError(
                "reward.reward_manager.source is importlib but neither reward.reward_manager.module.path "
                "nor .module.name is set; set one of them to the file or module that defines "
                f"{name or 'the manager class'}"
            )
    elif source != "register":
        raise ConfigError(f"reward.reward_manager.source must be register or importlib (as in verl), got {source!r}")
    elif name == HOOK_NAME:
        out["manager"] = "naive"  # the hook under the name rewardq's verl plugin registers
    elif name:
        out["manager"] = str(name)


#: The module verl's ``reward.reward_manager.module.path`` names to forward its reward loop to rewardq.
HOOK_MODULE = "rewardq.integrations.verl"
HOOK_CLASS = "RewardqRewardManager"
#: The name under which rewardq's verl plugin (:mod:`rewardq.integrations.verl.plugin`) registers the
#: hook in verl's reward-manager registry: ``reward.reward_manager.name=rewardq`` alone selects it.
HOOK_NAME = "rewardq"


def is_rewardq_hook(name: object, path: object, module: object) -> bool:
    """Whether verl's ``reward.reward_manager`` (source importlib) names rewardq's own reward-loop hook
    (:class:`rewardq.integrations.verl.RewardqRewardManager`): then the workers score with the manager
    ``reward.rewardq.manager`` names (``naive`` by default), not with the hook itself."""
    if name != HOOK_CLASS:
        return False
    given = path[len("pkg://") :].replace("/", ".") if isinstance(path, str) and path.startswith("pkg://") else None
    return HOOK_MODULE in (given, module)


def _reward_function(r: _Reader, out: dict[str, object]) -> None:
    path = r.get("reward.custom_reward_function.path")
    fn = r.get("reward.custom_reward_function.name") or "compute_score"
    if not path:
        return
    out["reward_fn"] = f"{path}:{fn}"
    kwargs = r.get("reward.custom_reward_function.reward_kwargs")
    if isinstance(kwargs, Mapping) and kwargs:
        out["reward_fn_kwargs"] = dict(kwargs)


def _reward_kwargs(r: _Reader, opts: dict[str, object]) -> None:
    kwargs = r.get("reward.reward_kwargs")
    if not isinstance(kwargs, Mapping):
        return
    for key, value in kwargs.items():
        r.read.add(f"reward.reward_kwargs.{key}")
        if value is None:
            continue
        opts["overlong_buffer" if key == "overlong_buffer_cfg" else str(key)] = (
            dict(value) if isinstance(value, Mapping) else value
        )


def _unused(node: Mapping[str, object], path: str, read: set[str]) -> list[str]:
    """Dotted paths under ``path`` that hold a value and were never read; a subtree of which
    nothing was read is reported as one path. Hydra's ``_target_`` keys are plumbing, not settings."""
    out: list[str] = []
    for key, value in node.items():
        if key == "_target_":
            continue
        child = f"{path}.{key}"
        if child in read:
            continue
        if isinstance(value, Mapping):
            if any(p == child or p.startswith(child + ".") for p in read):
                out += _unused(value, child, read)
            elif _has_value(value):
                out.append(child)
        elif value is not None and value != _MISSING:
            out.append(child)
    return out


def _has_value(node: Mapping[str, object]) -> bool:
    return any(
        _has_value(v) if isinstance(v, Mapping) else (v is not None and v != _MISSING)
        for k, v in node.items()
        if k != "_target_"
    )
