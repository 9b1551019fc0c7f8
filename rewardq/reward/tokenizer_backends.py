"""The two tokenizer backends :func:`rewardq.reward.tokenizer.load_tokenizer` returns, behind one
small surface (the :class:`~rewardq.reward.tokenizer.Tokenizer` protocol):

* :class:`FastTokenizer`: a ``tokenizers.Tokenizer`` (a ``tokenizer.json``) plus the special-token
  names and chat template it lacks, read from the folder's side files;
* :class:`TransformersTokenizer`: a ``transformers`` tokenizer, used as verl uses it.

:func:`batch_decoder` gives the Rust batch decode of either when it decodes exactly as ``decode``
does (the worker decodes a batch's responses with it, outside the GIL), and :func:`byte_level_table`
a table of each id's bytes for a byte-level BPE tokenizer (:mod:`rewardq.reward.byte_level`; the
worker decodes with it in the event loop, ~7x less CPU than the Rust decode).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rewardq.reward.byte_level import ByteLevelTable
from rewardq.reward.chat_template import render_chatml, render_jinja_chat

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "FastTokenizer",
    "HFTokenizer",
    "TransformersTokenizer",
    "as_id_list",
    "batch_decoder",
    "byte_level_table",
    "exact_rust_tokenizer",
    "rust_decode_batch",
]


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
        conversation: list[Mapping[str, object]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs: object,
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

    def batch_decode(self, sequences: Sequence[object], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(seq, skip_special_tokens=skip_special_tokens) for seq in sequences]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``. Special-token strings in the text become their special ids."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
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

    def batch_decode(self, sequences: Sequence[object], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(seq, skip_special_tokens=skip_special_tokens) for seq in sequences]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, object]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: object,
    ) -> str | list[int]:
        return self.backend.apply_chat_template(
            list(messages), tokenize=tokenize, add_generation_prompt=add_generation_prompt, **kwargs
        )


def batch_decoder(tokenizer: object) -> Callable[[list[list[int]], bool], list[str]] | None:
    """``tokenizer``'s Rust ``decode_batch(sequences, skip_special_tokens)`` when it gives exactly
    what ``tokenizer.decode`` gives for each sequence (and releases the GIL); None otherwise
    (see :func:`exact_rust_tokenizer`)."""
    rust = exact_rust_tokenizer(tokenizer)
    return None if rust is None else rust_decode_batch(rust)


def byte_level_table(tokenizer: object) -> ByteLevelTable | None:
    """A table that decodes exactly as ``tokenizer.decode`` does, when ``tokenizer`` is a
    byte-level BPE tokenizer (:mod:`rewardq.reward.byte_level`); None otherwise."""
    rust = exact_rust_tokenizer(tokenizer)
    return None if rust is None else ByteLevelTable.of(rust)


def exact_rust_tokenizer(tokenizer: object) -> object | None:
    """The ``tokenizers.Tokenizer`` whose ``decode`` is exactly ``tokenizer.decode``, or None.

    That holds for a :class:`FastTokenizer`, and for a :class:`TransformersTokenizer` over a fast
    tokenizer that does not post-process its decode (no ``clean_up_tokenization_spaces``, no
    ``decode`` of its own), which is what a byte-level BPE folder loads as.
    """
    if isinstance(tokenizer, FastTokenizer):
        return tokenizer.backend
    if not isinstance(tokenizer, TransformersTokenizer):
        return None
    backend = tokenizer.backend
    rust: object | None = getattr(backend, "backend_tokenizer", None)
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
    return rust


def rust_decode_batch(rust: object) -> Callable[[list[list[int]], bool], list[str]] | None:
    fn = getattr(rust, "decode_batch", None)
    if fn is None:
        return None

    def decode_batch(sequences: list[list[int]], skip_special_tokens: bool) -> list[str]:
        return list(fn(sequences, skip_special_tokens=skip_special_tokens))

    return decode_batch
