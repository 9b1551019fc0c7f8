"""One declaration per setting, and every door into it derived from that declaration.

A setting is a field of a settings dataclass (:class:`rewardq.config.WorkerConfig`) declared with
:func:`setting`: its type is the field's annotation, and the declaration gives its default, its
help text and, where they apply, bounds, choices and another flag spelling. From it come

* the environment variable ``REWARDQ_<NAME>`` (:func:`env_values`);
* the config-file key ``<name>`` (:func:`file_value` checks what a YAML/JSON file holds;
  :mod:`rewardq.config_file` reads the file, verl's trainer config included);
* the command-line flag ``--<name-with-dashes>`` with its ``--help`` line showing the default and
  the variable (:mod:`rewardq.ops.flags`), what given flags mean (:func:`flag_values`) and the
  flags that reproduce them (:func:`flag_argv`);
* the checks every value passes, whichever layer it came from (:func:`check_bounds`);
* where each value came from (:class:`Layers`), which ``rewardq config`` prints.

Its modules, each importing only those above it here: :mod:`.declare` (the declaration, and
:class:`Setting`, every name it goes by), :mod:`.values` (parsing, checking and layering values)
and :mod:`.argv` (the command line's meaning, without click). Every name is imported from this
package.

So a new setting is one :func:`setting` line in :class:`~rewardq.config.WorkerConfig`.

Why a dataclass with field metadata, not pydantic-settings or msgspec: the core install is
redis, msgpack and numpy, and the worker extra must go into a verl 0.9.1 environment without
adding or moving a package. verl's environment has pydantic but not pydantic-settings, and
msgspec arrives there only with transferqueue, so either would be a new dependency for every
verl user. What the settings need (five scalar kinds plus JSON objects, bounds, choices, layered
sources) fits in this module, and the settings stay plain dataclasses that code, tests and
benchmarks construct directly, with static types mypy checks.

The command-line half (click options, ``--help`` lines) is :mod:`rewardq.ops.flags`: this package
imports nothing beyond the standard library and :mod:`rewardq.errors`, so the producer side (no
worker extra, no click) can import :mod:`rewardq.config`.
"""

from rewardq.settings.argv import NONE_GIVEN, flag_argv, flag_values, parse_pairs
from rewardq.settings.declare import ENV_PREFIX, Setting, Spec, same_as, setting, settings_of
from rewardq.settings.values import (
    FALSE_WORDS,
    NONE_WORDS,
    TRUE_WORDS,
    Layers,
    check_bounds,
    choice_of,
    env_values,
    file_value,
    parse_bool,
    parse_text,
)

__all__ = [
    "ENV_PREFIX",
    "TRUE_WORDS",
    "FALSE_WORDS",
    "NONE_WORDS",
    "NONE_GIVEN",
    "Setting",
    "Spec",
    "Layers",
    "setting",
    "settings_of",
    "same_as",
    "parse_bool",
    "parse_text",
    "file_value",
    "check_bounds",
    "choice_of",
    "env_values",
    "flag_values",
    "flag_argv",
    "parse_pairs",
]
