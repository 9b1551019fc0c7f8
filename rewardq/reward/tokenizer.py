"""Load the tokenizer a reward worker decodes responses with, and fingerprint it.

Managers need four things from a tokenizer: ``decode`` the response ids to text,
``encode`` text (tests, judges), ``vocab_size`` (the codec rejects out-of-range ids)
and, for reward models over HTTP, ``apply_chat_template``. :func:`load_tokenizer`
returns an object with exactly that surface (the :class:`Tokenizer` protocol; the two wrappers
that provide it are :mod:`rewardq.reward.tokenizer_backends`) from:

* ``"builtin:demo"`` → the bundled demo tokenizer (byte-level BPE, ~3k tokens, ChatML
  special tokens; see :mod:`tools.make_demo_tokenizer`). It must be asked for by name:
  there is no default tokenizer, because a worker decoding with a tokenizer other than the
  trainer's computes every reward from the wrong text;
* a ``tokenizer.json`` file → the ``tokenizers`` library (special-token names and the
  chat template come from a ``tokenizer_config.json`` beside it, if there is one);
* a Hugging Face tokenizer folder → ``transformers.AutoTokenizer`` when transformers
  is installed, else ``tokenizers`` on the folder's ``tokenizer.json`` plus its
  ``tokenizer_config.json``;
* a Hub id (``Qwen/Qwen2.5-7B-Instruct``) → loaded as verl loads it: through transformers
  when installed, else (or when transformers cannot, e.g. a repository without ``config.json``)
  the tokenizer files from the Hugging Face cache (``huggingface_hub.snapshot_download``). Both
  read the cache under ``HF_HOME`` only, offline (``local_files_only``, as ``HF_HUB_OFFLINE=1``
  does): a worker never waits on the network (transformers retries an unreachable Hub for about
  a minute), and a tokenizer that is neither local nor cached fails at once with a message
  saying how to fill the cache.

:func:`rewardq.reward.tokenizer_fingerprint.tokenizer_fingerprint` names a tokenizer by its
vocabulary (``sha256=<16 hex digits of the id -> token map> vocab=<ids> name=<where it came
from>``). Producers send it with every record and a worker refuses records made with another vocabulary (see
:func:`rewardq.queue.checks.tokenizer_mismatch`).

Example::

    >>> tok = load_tokenizer("builtin:demo")
    >>> ids = tok.encode("Natalia sold 48 clips. #### 48")
    >>> tok.decode(ids + [tok.eos_token_id])          # special tokens are skipped
    'Natalia sold 48 clips. #### 48'

Chat templates without transformers are rendered with jinja2 the way transformers
does (sandboxed, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``tojson``,
``strftime_now``). With no template, or without jinja2, the ChatML fallback is used::

    <|im_start|>{role}\\n{content}<|im_end|>\\n   (per message)
    <|im_start|>assistant\\n                      (when add_generation_prompt)
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rewardq.errors import ConfigError
from rewardq.reward.tokenizer_backends import FastTokenizer, TransformersTokenizer

logger = logging.getLogger("rewardq.reward")

DEMO_SPEC = "builtin:demo"
DEMO_PATH = Path(__file__).resolve().parent.parent / "assets" / "demo-tokenizer.json"
#: Special-token names of the demo tokenizer (Qwen-instruct conventions).
DEMO_SPECIAL = {"eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>"}
BACKENDS = ("auto", "tokenizers", "transformers")


@runtime_checkable
class Tokenizer(Protocol):
    """What rewardq needs from a tokenizer (both wrappers of :mod:`.tokenizer_backends` implement it)."""

    @property
    def eos_token(self) -> str | None: ...

    @property
    def bos_token(self) -> str | None: ...

    @property
    def vocab_size(self) -> int: ...

    def decode(self, ids: object, skip_special_tokens: bool = True) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: object,
    ) -> str | list[int]: ...


# --------------------------------------------------------------------------------------
# a tokenizer folder's special-token names and chat template
# --------------------------------------------------------------------------------------


def _token_str(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}; fix or remove the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _pick_template(value: object) -> str | None:
    if isinstance(value, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default") or next(iter(named.values()), None)
    return value if isinstance(value, str) else None


def folder_metadata(folder: Path) -> dict[str, object]:
    """Special-token names and chat template from a Hugging Face tokenizer folder's side files."""
    meta: dict[str, Any] = {"eos_token": None, "bos_token": None, "pad_token": None, "chat_template": None}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
        path = folder / fname
        if path.is_file():
            data = _read_json(path)
            for key in ("eos_token", "bos_token", "pad_token"):
                if key in data:
                    meta[key] = _token_str(data[key])
            if "chat_template" in data:
                meta["chat_template"] = _pick_template(data["chat_template"])
    if (folder / "chat_template.jinja").is_file():
        meta["chat_template"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    elif meta["chat_template"] is None and (folder / "chat_template.json").is_file():
        meta["chat_template"] = _pick_template(_read_json(folder / "chat_template.json").get("chat_template"))
    return meta


def _from_tokenizer_json(path: Path, name: str, meta: dict[str, Any]) -> FastTokenizer:
    from tokenizers import Tokenizer as RawTokenizer

    try:
        backend = RawTokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a bad tokenizer.json
        raise ConfigError(
            f"cannot load tokenizer {str(path)!r}: {exc}. Give a tokenizer.json written by the "
            "tokenizers/transformers libraries, a Hugging Face tokenizer folder, or builtin:demo"
        ) from None
    return FastTokenizer(backend, name, **meta)


def _transformers_available() -> bool:
    try:
        import transformers  # noqa: F401 - only whether it imports matters
    except ImportError:
        return False
    return True


#: What to do when no tokenizer was given (``rewardq worker`` exits 2 with it).
NO_TOKENIZER = (
    "no tokenizer given: a reward worker must decode responses with the tokenizer the trainer "
    "encoded them with, so there is no default. Pass --tokenizer (a Hugging Face tokenizer folder, "
    "a Hub id in the local Hugging Face cache, or a tokenizer.json; builtin:demo only for the demo's "
    "own data), or set REWARDQ_TOKENIZER, or tokenizer: in the config file. From a verl config "
    "(--config) it is read as verl reads it: actor_rollout_ref.model.tokenizer_path, else "
    "actor_rollout_ref.model.path"
)
#: Files of a Hugging Face repository that make up its tokenizer (what a Hub id fetches without transformers).
TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def looks_like_hub_id(text: str) -> bool:
    """``org/name`` or ``name``: what transformers would look up on the Hub (not a path, not a URL)."""
    return bool(_HUB_ID.fullmatch(text)) and ".." not in text and not text.endswith((".json", ".model"))


def _hub_help(name: str, origin: str | None) -> str:
    from huggingface_hub import constants

    where = f" ({origin})" if origin else ""
    files = f"{name} --include 'tokenizer*' '*.json'"
    return (
        f"cannot load the tokenizer {name!r}{where}: it is not a folder on this machine and not in the "
        f"local Hugging Face cache {constants.HF_HUB_CACHE}. Workers read a Hub id from that cache only, "
        "offline (as with HF_HUB_OFFLINE=1), never from the network. Fill the cache on this machine, with "
        f"HF_HOME as the workers have it: `hf download {files}` (huggingface_hub before 1.0: "
        f"`huggingface-cli download {files}`); or pass --tokenizer with a local tokenizer folder or "
        "tokenizer.json"
    )


def _from_transformers(path: str, origin: str | None = None, name: str | None = None) -> TransformersTokenizer:
    """transformers' tokenizer of the folder ``path`` (``name``: the Hub id it is the cached snapshot of).

    A folder, never a Hub id: given an id, transformers asks huggingface_hub, which may reach the
    network even with ``local_files_only`` (huggingface_hub 1.33 fetched its user-agent registry).
    """
    from transformers import AutoTokenizer

    try:
        backend = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, HTTP errors, ...: one ConfigError
        raise ConfigError(
            f"transformers could not load a tokenizer from {name or path!r}{f' ({origin})' if origin else ''}: "
            f"{_first_line(exc)}. Give a Hugging Face tokenizer folder or a tokenizer.json with --tokenizer"
        ) from None
    return TransformersTokenizer(backend, name or path)


def _hub_cached(name: str, origin: str | None) -> Path:
    """The folder of Hub id ``name``'s tokenizer files in the local Hugging Face cache, looked up
    offline; a :class:`ConfigError` saying how to fill the cache when it is not there."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # tokenizers depends on it; only a stripped environment lacks it
        raise ConfigError(
            f"tokenizer {name!r} is a Hub id, and loading one needs huggingface_hub or transformers: "
            "pip install transformers, or pass --tokenizer with a local tokenizer folder"
        ) from None
    try:
        return Path(snapshot_download(name, allow_patterns=TOKENIZER_FILES, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (LocalEntryNotFoundError), an unreadable cache, ...
        raise ConfigError(_hub_help(name, origin)) from None


def _from_hub_cache(name: str, folder: Path) -> FastTokenizer:
    """A Hub id's cached tokenizer files, read without transformers."""
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(
            f"the Hugging Face repository {name!r} has no tokenizer.json (a slow tokenizer); "
            "pip install transformers to load it, or pass --tokenizer with a fast tokenizer"
        )
    return _from_tokenizer_json(folder / "tokenizer.json", name, folder_metadata(folder))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def load_demo_tokenizer() -> FastTokenizer:
    """The bundled demo tokenizer (ChatML special tokens, ChatML chat format)."""
    if not DEMO_PATH.is_file():
        raise ConfigError(
            f"the bundled demo tokenizer is missing ({DEMO_PATH}); reinstall rewardq or run "
            "python -m tools.make_demo_tokenizer"
        )
    return _from_tokenizer_json(DEMO_PATH, DEMO_SPEC, dict(DEMO_SPECIAL, chat_template=None))


def load_tokenizer(
    path: str | os.PathLike[str] | None, *, backend: str = "auto", origin: str | None = None
) -> Tokenizer:
    """Load a tokenizer (see the module docstring for what ``path`` may be).

    Args:
        path: ``"builtin:demo"``, a ``tokenizer.json`` file, a tokenizer folder, or a Hub id.
        backend: ``"auto"`` (transformers for folders when installed), ``"tokenizers"``
            (never import transformers) or ``"transformers"`` (require it).
        origin: where ``path`` came from (``"actor_rollout_ref.model.path in run.yaml"``), named
            in errors.

    Raises:
        ConfigError: no path was given (:data:`NO_TOKENIZER`), or it does not exist, is not
            cached or holds no usable tokenizer; the message names the path and what to do.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"tokenizer backend must be one of {BACKENDS}, got {backend!r}")
    check_tokenizer_spec(path, origin=origin)
    text = os.fspath(path or "")
    if text == DEMO_SPEC:
        return load_demo_tokenizer()
    p = Path(text).expanduser()
    use_transformers = backend == "transformers" or (backend == "auto" and _transformers_available())
    if backend == "transformers" and not _transformers_available():
        raise ConfigError(
            "tokenizer backend 'transformers' was asked for but transformers is not installed: pip install transformers"
        )
    if p.is_file():
        if backend == "transformers":
            return _from_transformers(str(p.parent), origin)
        return _from_tokenizer_json(p, text, folder_metadata(p.parent))
    if p.is_dir():
        if use_transformers:
            return _from_transformers(str(p), origin)
        tj = p / "tokenizer.json"
        if not tj.is_file():
            raise ConfigError(
                f"tokenizer folder {text!r} has no tokenizer.json. Without transformers rewardq "
                "reads only fast tokenizers (tokenizer.json); pip install transformers to load "
                "this folder, or save it with a fast tokenizer"
            )
        return _from_tokenizer_json(tj, text, folder_metadata(p))
    if looks_like_hub_id(text):
        cached = _hub_cached(text, origin)  # the cache, offline, first: a miss fails at once
        if not use_transformers:
            return _from_hub_cache(text, cached)
        try:
            return _from_transformers(str(cached), origin, name=text)
        except ConfigError as exc:
            try:  # a repository of tokenizer files alone (no config.json) is still a tokenizer
                return _from_hub_cache(text, cached)
            except ConfigError:
                raise exc from None
    raise ConfigError(f"tokenizer path {text!r} is neither a file nor a folder")  # a socket, a FIFO, ...


def check_tokenizer_spec(path: str | os.PathLike[str] | None, *, origin: str | None = None) -> None:
    """Refuse, importing nothing heavier than huggingface_hub, a tokenizer :func:`load_tokenizer`
    cannot load: none given (:data:`NO_TOKENIZER`), an unknown ``builtin:``, a Hub id that is not in
    the local Hugging Face cache, or a path that is not on this machine and is no Hub id either
    (``origin``: where the path came from, named in the error)."""
    if path is None or not os.fspath(path).strip():
        raise ConfigError(NO_TOKENIZER)
    text = os.fspath(path)
    if text == DEMO_SPEC:
        return
    if text.startswith("builtin:"):
        raise ConfigError(f"unknown built-in tokenizer {text!r}; the only one is {DEMO_SPEC!r}")
    p = Path(text).expanduser()
    if p.exists():
        return
    if looks_like_hub_id(text):
        _hub_cached(text, origin)
        return
    where = f" ({origin})" if origin else ""
    raise ConfigError(
        f"tokenizer path {text!r}{where} does not exist on this machine (looked in {str(p.absolute())!r}). "
        "Copy the trainer's tokenizer folder here, or pass --tokenizer with a Hugging Face tokenizer "
        "folder, a Hub id in the local Hugging Face cache or a tokenizer.json (builtin:demo only for "
        "the demo's own data)"
    )
