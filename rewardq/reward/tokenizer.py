"""Load the tokenizer a reward worker decodes responses with, and fingerprint it.

Managers need four things from a tokenizer: ``decode`` the response ids to text,
``encode`` text (tests, judges), ``vocab_size`` (the codec rejects out-of-range ids)
and, for reward models over HTTP, ``apply_chat_template``. :func:`load_tokenizer`
returns an object with exactly that surface (the :class:`Tokenizer` protocol) from:

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
  read the cache under ``HF_HOME`` and honour offline mode (``HF_HUB_OFFLINE=1``); a tokenizer
  that is neither local nor cached fails with a message saying how to download it.

:func:`rewardq.reward.fingerprint.tokenizer_fingerprint` names a tokenizer by its vocabulary (``sha256=<16 hex digits of
the id -> token map> vocab=<ids> name=<where it came from>``). Producers send it with every
record and a worker refuses records made with another vocabulary (see
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rewardq.errors import ConfigError
from rewardq.reward.chat_template import render_chatml, render_jinja_chat

if TYPE_CHECKING:
    import tokenizers

logger = logging.getLogger("rewardq.reward")

DEMO_SPEC = "builtin:demo"
DEMO_PATH = Path(__file__).resolve().parent.parent / "assets" / "demo-tokenizer.json"
#: Special-token names of the demo tokenizer (Qwen-instruct conventions).
DEMO_SPECIAL = {"eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>"}
BACKENDS = ("auto", "tokenizers", "transformers")


@runtime_checkable
class Tokenizer(Protocol):
    """What rewardq needs from a tokenizer (both wrappers below implement it)."""

    @property
    def eos_token(self) -> str | None: ...

    @property
    def bos_token(self) -> str | None: ...

    @property
    def vocab_size(self) -> int: ...

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | list[int]: ...


class HFTokenizer(Protocol):
    """What :class:`TransformersTokenizer` reads of a ``transformers`` tokenizer (which ships no types)."""

    eos_token: str | None
    bos_token: str | None
    pad_token: str | None
    eos_token_id: int | None
    bos_token_id: int | None
    pad_token_id: int | None

    def __len__(self) -> int: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | list[int]: ...


def as_id_list(ids: Any) -> list[int]:
    """A list, tuple, numpy array or torch tensor of ids (1-D or a single id) as ``list[int]``."""
    if hasattr(ids, "detach"):  # torch.Tensor
        ids = ids.detach().cpu()
    if hasattr(ids, "tolist"):  # torch / numpy, also 0-d
        ids = ids.tolist()
        if isinstance(ids, list) and ids and type(ids[0]) is int:  # integer dtype: Python ints already
            return ids
    if isinstance(ids, int):
        return [ids]
    out = list(ids)
    if out and isinstance(out[0], (list, tuple)):
        raise ValueError("decode takes one sequence of ids; use batch_decode for several")
    return [int(i) for i in out]


class FastTokenizer:
    """A ``tokenizers.Tokenizer`` plus the special-token names and chat template it lacks.

    Args:
        backend: the ``tokenizers.Tokenizer``.
        name: where it came from (shown in errors and ``repr``).
        eos_token, bos_token, pad_token: special-token strings, or None.
        chat_template: a jinja chat template, or None for the ChatML fallback.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        name: str,
        *,
        eos_token: str | None = None,
        bos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.name = name
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.pad_token = pad_token
        self.chat_template = chat_template

    def __repr__(self) -> str:
        return f"FastTokenizer({self.name!r}, vocab_size={self.vocab_size})"

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def vocab_size(self) -> int:
        """Number of ids, added/special tokens included (valid ids are ``0 .. vocab_size-1``)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    def decode(self, ids: object, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens (``<|im_end|>`` ...) are dropped unless asked for."""
        return self.backend.decode(as_id_list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Sequence[Any], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(seq, skip_special_tokens=skip_special_tokens) for seq in sequences]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``. Special-token strings in the text become their special ids."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: object,
    ) -> str | list[int]:
        """Render a chat with the folder's template (jinja2) or the ChatML fallback."""
        text = None
        if self.chat_template is not None:
            text = render_jinja_chat(
                self.chat_template,
                messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                pad_token=self.pad_token,
                **kwargs,
            )
        if text is None:
            text = render_chatml(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text


class TransformersTokenizer:
    """A ``transformers`` tokenizer behind the same small surface as :class:`FastTokenizer`."""

    def __init__(self, backend: HFTokenizer, name: str) -> None:
        self.backend = backend
        self.name = name

    def __repr__(self) -> str:
        return f"TransformersTokenizer({self.name!r}, vocab_size={self.vocab_size})"

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def vocab_size(self) -> int:
        """``len(tokenizer)``: unlike transformers' ``vocab_size``, counts added tokens."""
        return len(self.backend)

    @property
    def eos_token(self) -> str | None:
        return self.backend.eos_token

    @property
    def bos_token(self) -> str | None:
        return self.backend.bos_token

    @property
    def pad_token(self) -> str | None:
        return self.backend.pad_token

    @property
    def eos_token_id(self) -> int | None:
        return self.backend.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.backend.bos_token_id

    @property
    def pad_token_id(self) -> int | None:
        return self.backend.pad_token_id

    def decode(self, ids: object, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(as_id_list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Sequence[Any], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(seq, skip_special_tokens=skip_special_tokens) for seq in sequences]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: object,
    ) -> str | list[int]:
        return self.backend.apply_chat_template(
            list(messages), tokenize=tokenize, add_generation_prompt=add_generation_prompt, **kwargs
        )


def batch_decoder(tokenizer: object) -> Callable[[list[list[int]], bool], list[str]] | None:
    """``tokenizer``'s Rust ``decode_batch(sequences, skip_special_tokens)`` when it gives exactly
    what ``tokenizer.decode`` gives for each sequence (and releases the GIL); None otherwise.

    That holds for a :class:`FastTokenizer`, and for a :class:`TransformersTokenizer` over a fast
    tokenizer that does not post-process its decode (no ``clean_up_tokenization_spaces``, no
    ``decode`` of its own), which is what a byte-level BPE folder loads as.
    """
    if isinstance(tokenizer, FastTokenizer):
        return _rust_decode_batch(tokenizer.backend)
    if not isinstance(tokenizer, TransformersTokenizer):
        return None
    backend = tokenizer.backend
    rust = getattr(backend, "backend_tokenizer", None)
    if rust is None or getattr(backend, "clean_up_tokenization_spaces", True) is not False:
        return None
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    cls = type(backend)
    if not issubclass(cls, PreTrainedTokenizerFast) or any(
        getattr(cls, m, None) is not getattr(PreTrainedTokenizerFast, m, None) for m in ("decode", "_decode")
    ):
        return None
    return _rust_decode_batch(rust)


def _rust_decode_batch(rust: object) -> Callable[[list[list[int]], bool], list[str]] | None:
    fn = getattr(rust, "decode_batch", None)
    if fn is None:
        return None

    def decode_batch(sequences: list[list[int]], skip_special_tokens: bool) -> list[str]:
        return list(fn(sequences, skip_special_tokens=skip_special_tokens))

    return decode_batch


# --------------------------------------------------------------------------------------
# chat templates
# --------------------------------------------------------------------------------------


def _token_str(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
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


def folder_metadata(folder: Path) -> dict[str, Any]:
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

    offline = " (offline mode is on: HF_HUB_OFFLINE)" if constants.HF_HUB_OFFLINE else ""
    where = f" ({origin})" if origin else ""
    return (
        f"cannot load the tokenizer {name!r}{where}: it is not a folder on this machine and not in the "
        f"local Hugging Face cache {constants.HF_HUB_CACHE}{offline}. Download it into the cache here "
        f"(`hf download {name} --include 'tokenizer*' '*.json'`, with HF_HOME as the workers have it), "
        "or pass --tokenizer with a local tokenizer folder or tokenizer.json"
    )


def _from_transformers(path: str, origin: str | None = None) -> TransformersTokenizer:
    from transformers import AutoTokenizer

    try:
        backend = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, HTTP errors, ...: one ConfigError
        if not Path(path).expanduser().exists() and looks_like_hub_id(path):
            raise ConfigError(f"{_hub_help(path, origin)} [{type(exc).__name__}: {_first_line(exc)}]") from None
        raise ConfigError(
            f"transformers could not load a tokenizer from {path!r}{f' ({origin})' if origin else ''}: "
            f"{_first_line(exc)}. Give a Hugging Face tokenizer folder or a tokenizer.json with --tokenizer"
        ) from None
    return TransformersTokenizer(backend, path)


def _from_hub_cache(name: str, origin: str | None) -> FastTokenizer:
    """A Hub id without transformers: its tokenizer files through huggingface_hub (cache first)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # tokenizers depends on it; only a stripped environment lacks it
        raise ConfigError(
            f"tokenizer {name!r} is a Hub id, and loading one needs huggingface_hub or transformers: "
            "pip install transformers, or pass --tokenizer with a local tokenizer folder"
        ) from None
    try:
        folder = Path(snapshot_download(name, allow_patterns=TOKENIZER_FILES))
    except Exception as exc:  # noqa: BLE001 - offline and not cached, no network, no such repository, ...: one ConfigError
        raise ConfigError(f"{_hub_help(name, origin)} [{type(exc).__name__}: {_first_line(exc)}]") from None
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
        if not use_transformers:
            return _from_hub_cache(text, origin)
        try:
            return _from_transformers(text, origin)
        except ConfigError as exc:
            try:  # a repository of tokenizer files alone (no config.json) is still a tokenizer
                return _from_hub_cache(text, origin)
            except ConfigError:
                raise exc from None
    raise ConfigError(f"tokenizer path {text!r} is neither a file nor a folder")  # a socket, a FIFO, ...


def check_tokenizer_spec(path: str | os.PathLike[str] | None, *, origin: str | None = None) -> None:
    """Refuse, without importing anything, a tokenizer :func:`load_tokenizer` cannot load: none given
    (:data:`NO_TOKENIZER`), an unknown ``builtin:``, or a path that is not on this machine and is
    no Hub id either (``origin``: where the path came from, named in the error)."""
    if path is None or not os.fspath(path).strip():
        raise ConfigError(NO_TOKENIZER)
    text = os.fspath(path)
    if text == DEMO_SPEC:
        return
    if text.startswith("builtin:"):
        raise ConfigError(f"unknown built-in tokenizer {text!r}; the only one is {DEMO_SPEC!r}")
    p = Path(text).expanduser()
    if p.exists() or looks_like_hub_id(text):
        return
    where = f" ({origin})" if origin else ""
    raise ConfigError(
        f"tokenizer path {text!r}{where} does not exist on this machine (looked in {str(p.absolute())!r}). "
        "Copy the trainer's tokenizer folder here, or pass --tokenizer with a Hugging Face tokenizer "
        "folder, a Hub id in the local Hugging Face cache or a tokenizer.json (builtin:demo only for "
        "the demo's own data)"
    )
