"""Chat templates as a tokenizer applies them without transformers: ChatML, and a folder's own
Jinja template (``tokenizer_config.json``'s ``chat_template``) rendered with jinja2 where it is
installed, as transformers renders it."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

__all__ = ["render_chatml", "render_jinja_chat"]

logger = logging.getLogger("rewardq.reward")


def _content_text(content: object) -> str:
    if isinstance(content, list):  # OpenAI-style parts: keep the text ones
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def render_chatml(messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = False) -> str:
    """The ChatML fallback (see the module docstring)."""
    parts = [f"<|im_start|>{m['role']}\n{_content_text(m.get('content'))}<|im_end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def render_jinja_chat(template: str, messages: Sequence[Mapping[str, object]], **variables: object) -> str | None:
    """Render a transformers-style chat template; None when jinja2 is not installed."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        logger.warning(
            "jinja2 is not installed, so the tokenizer's chat template cannot be rendered; "
            "using the ChatML fallback (pip install jinja2 to use the real template)"
        )
        return None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: object,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(messages=list(messages), **variables)
    except jinja2.exceptions.TemplateError as exc:
        raise ValueError(f"the tokenizer's chat template failed to render: {exc}") from exc


# --------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------
