"""Reading a score out of a judge's answer: a regex, a JSON field, or a choice list.

Each parser has :meth:`parse` (text -> float, or :class:`Unparsed` saying why not), the
instructions the default prompt gives the judge (``{format_instructions}``), and, where it
applies, the JSON schema of a structured answer (OpenAI's ``response_format`` with
``type: json_schema``, which vLLM, SGLang and hosted providers enforce while decoding).

* ``regex``: the **last** match of ``score_regex`` in the answer; its first group (or the group
  named ``score``) is the number. The last, because judges reason first and conclude last.
* ``json``: the field ``score_field`` (a dotted path, ``verdict.score``) of the JSON object in
  the answer: the whole answer, a fenced ```json block, or the last ``{...}`` object in it.
* ``choice``: one of ``choices``: a list of numbers (the last number in the answer that is one of
  them), or a mapping of labels to scores (``{"yes": 1, "no": 0}``: the last label found, as a
  whole word, case-insensitive).

With structured output, ``json`` and ``choice`` ask for ``{"<score_field>": ...}`` (a number, or
one of the choices) and read that field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewardq.errors import ConfigError

#: ``Score: 7``, ``score = 0.5``, ``**Score:** 1``, ``Final score: 3/10`` (the 3).
DEFAULT_SCORE_REGEX = r"(?i)score[^\w+-]{0,4}([-+]?\d+(?:\.\d+)?)"
PARSERS = ("regex", "json", "choice")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass
class Unparsed:
    """An answer without a readable score, and why."""

    reason: str


class ScoreParser:
    """Base: ``parse(text) -> float | Unparsed``."""

    def parse(self, text: str) -> float | Unparsed:
        raise NotImplementedError

    def format_instructions(self) -> str:
        raise NotImplementedError

    def response_format(self) -> dict[str, Any] | None:
        """The structured-output ``response_format`` for this parser, or None where none applies."""
        return None


class RegexParser(ScoreParser):
    def __init__(self, pattern: str = DEFAULT_SCORE_REGEX) -> None:
        try:
            self.pattern = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"manager 'genrm': score_regex {pattern!r} is not a valid regular expression: {exc}"
            ) from None
        if self.pattern.groups < 1:
            raise ConfigError(f"manager 'genrm': score_regex {pattern!r} needs a group capturing the number")
        self.group: int | str = "score" if "score" in self.pattern.groupindex else 1

    def parse(self, text: str) -> float | Unparsed:
        matches = list(self.pattern.finditer(text))
        if not matches:
            return Unparsed(f"no match of score_regex {self.pattern.pattern!r}")
        raw = matches[-1].group(self.group)
        number = _to_number(raw)
        return number if number is not None else Unparsed(f"score_regex matched {raw!r}, which is not a number")

    def format_instructions(self) -> str:
        return 'End your reply with a line "Score: <number>".'


class ChoiceParser(ScoreParser):
    """A score from a fixed list of numbers, or a mapping of labels to scores."""

    def __init__(self, choices: Sequence[Any] | Mapping[str, Any]) -> None:
        self.labels: dict[str, float] | None = None
        if isinstance(choices, Mapping):
            if not choices:
                raise ConfigError("manager 'genrm': choices must not be empty")
            self.labels = {str(k): _number_option("choices", v) for k, v in choices.items()}
            self.values = list(self.labels.values())
            words = sorted(self.labels, key=len, reverse=True)
            self.label_pattern = re.compile(r"(?i)(?<!\w)(" + "|".join(re.escape(w) for w in words) + r")(?!\w)")
        elif isinstance(choices, Sequence) and not isinstance(choices, (str, bytes)) and choices:
            self.values = [_number_option("choices", v) for v in choices]
        else:
            raise ConfigError(
                f"manager 'genrm': choices must be a list of numbers or a mapping of labels to scores, got {choices!r}"
            )

    def pick(self, value: object) -> float | Unparsed:
        """The score of one chosen value (a number or a label)."""
        if self.labels is not None:
            for label, score in self.labels.items():
                if str(value).strip().lower() == label.lower():
                    return score
            return Unparsed(f"{value!r} is none of the choices {list(self.labels)}")
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else _to_number(str(value))
        if number is not None:
            for v in self.values:
                if math.isclose(float(number), v, rel_tol=1e-9, abs_tol=1e-12):
                    return v
        return Unparsed(f"{value!r} is none of the choices {self.values}")

    def parse(self, text: str) -> float | Unparsed:
        if self.labels is not None:
            found = self.label_pattern.findall(text)
            return self.pick(found[-1]) if found else Unparsed(f"none of the choices {list(self.labels)} in the answer")
        for raw in reversed(_NUMBER.findall(text)):
            picked = self.pick(raw)
            if not isinstance(picked, Unparsed):
                return picked
        return Unparsed(f"no number of the choices {self.values} in the answer")

    def format_instructions(self) -> str:
        options = list(self.labels) if self.labels is not None else [_fmt(v) for v in self.values]
        return f"End your reply with exactly one of: {', '.join(options)}."

    def schema(self) -> dict[str, Any]:
        if self.labels is not None:
            return {"type": "string", "enum": list(self.labels)}
        return {"type": "number", "enum": self.values}


class JsonFieldParser(ScoreParser):
    """A number (or, with ``choices``, one of them) at ``field`` of the JSON object in the answer."""

    def __init__(self, field: str = "score", choices: ChoiceParser | None = None) -> None:
        if not isinstance(field, str) or not field or any(not part for part in field.split(".")):
            raise ConfigError(f"manager 'genrm': score_field must be a field name or a dotted path, got {field!r}")
        self.field = field
        self.path = field.split(".")
        self.choices = choices

    def parse(self, text: str) -> float | Unparsed:
        obj = find_json_object(text)
        if obj is None:
            return Unparsed("no JSON object in the answer")
        node: object = obj
        for part in self.path:
            if not isinstance(node, Mapping) or part not in node:
                return Unparsed(f"the JSON answer has no field {self.field!r}")
            node = node[part]
        if self.choices is not None:
            return self.choices.pick(node)
        if isinstance(node, bool) or not isinstance(node, (int, float, str)):
            return Unparsed(f"field {self.field!r} holds {node!r:.60}, not a number")
        number = float(node) if isinstance(node, (int, float)) else _to_number(node.strip())
        if number is None or not math.isfinite(number):
            return Unparsed(f"field {self.field!r} holds {node!r:.60}, not a finite number")
        return number

    def format_instructions(self) -> str:
        value = (
            "<number>"
            if self.choices is None
            else " | ".join(json.dumps(v) for v in (self.choices.labels or self.choices.values))
        )
        return f'Reply with only a JSON object: {{"{self.field}": {value}}}.'

    def response_format(self) -> dict[str, Any]:
        leaf: dict[str, Any] = self.choices.schema() if self.choices is not None else {"type": "number"}
        schema = leaf
        for part in reversed(self.path):
            schema = {"type": "object", "properties": {part: schema}, "required": [part], "additionalProperties": False}
        return {"type": "json_schema", "json_schema": {"name": "judgement", "schema": schema, "strict": True}}


def build_parser(
    kind: str, *, score_regex: str | None, score_field: str, choices: Any, structured: bool
) -> ScoreParser:
    """The parser the ``genrm`` options describe; ``structured``: the answer is a structured JSON object."""
    if kind not in PARSERS:
        raise ConfigError(f"manager 'genrm': score_parser must be one of {', '.join(PARSERS)}, got {kind!r}")
    if kind == "regex":
        if structured:
            raise ConfigError("manager 'genrm': structured_output applies to score_parser=json or choice, not regex")
        return RegexParser(score_regex or DEFAULT_SCORE_REGEX)
    if score_regex is not None:
        raise ConfigError(f"manager 'genrm': score_regex is for score_parser=regex, not {kind}")
    if kind == "json":
        return JsonFieldParser(score_field, ChoiceParser(choices) if choices is not None else None)
    if choices is None:
        raise ConfigError("manager 'genrm': score_parser=choice needs choices=[...] (numbers) or {label: score}")
    picker = ChoiceParser(choices)
    return JsonFieldParser(score_field, picker) if structured else picker


def find_json_object(text: str) -> Any:
    """The JSON object an answer holds: the whole text, a fenced block, or the last ``{...}`` in it."""
    stripped = text.strip()
    fenced = re.findall(r"```(?:json)?\s*(.*?)```", stripped, flags=re.DOTALL)
    for candidate in [stripped, *reversed(fenced)]:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    found, pos = None, 0
    while (start := stripped.find("{", pos)) >= 0:
        try:
            value, end = decoder.raw_decode(stripped, start)
        except ValueError:
            pos = start + 1
            continue
        if isinstance(value, dict):
            found = value  # the last top-level object that parses (objects nested in it are skipped)
        pos = end
    return found


def _to_number(raw: str) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _number_option(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"manager 'genrm': every score in {name} must be a finite number, got {value!r}")
    return float(value)


def _fmt(v: float) -> str:
    return str(int(v)) if v.is_integer() else repr(v)
