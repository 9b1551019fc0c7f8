"""A local stand-in for an OpenAI-compatible chat-completions server (an LLM judge), started by the tests.

``POST /v1/chat/completions`` parses the request as vLLM's OpenAI server does and answers
according to it:

* **The score** comes from the judged text: the last ``grade=<number>`` in the user message's text;
  without one, 1 when the text after ``Reference answer:`` appears in the text after
  ``Model's answer:``, else 0. ``votes=a,b,c`` makes choice ``i`` answer ``votes[i % 3]``.
* **The form** follows the request: with ``response_format`` ``json_schema`` the answer is exactly a
  JSON object of that schema (the score at the schema's property path; for a string ``enum``, the
  first label when the score is >= 0.5, else the last); when the prompt asks for "a JSON object",
  prose plus a fenced JSON block; otherwise prose ending ``Score: <x>``. ``n`` choices come back.
* **usage** counts words: prompt tokens = words of every text part + 85 per image; completion tokens
  = words of the answers.
* **Images** (``image_url`` parts) must be ``data:`` URLs with base64 PNG/JPEG/WebP; each is decoded
  and recorded (MIME type, size, SHA-256).
* **API key**: started with ``--api-key K``, a request without ``Authorization: Bearer K`` gets 401.

Hostile answers, asked for per request (in the judged text):

* ``judge-usage=<json>``: the answer's ``usage`` is that JSON value (``Infinity``, ``[1,2]``), or,
  for a number, its ``prompt_tokens`` is (``judge-usage=1000000000000000``);
* ``judge-echo=after`` / ``judge-echo=before``: the judge quotes the model's answer after its
  verdict line, or before it (a judge that reasons first and quotes an injection on the way);
* ``judge-pad=<bytes>``: the body is that many bytes, streamed with its ``Content-Length``;
  ``judge-chunked=<bytes>``: the same without one (chunked). Nothing that large is held in memory.

Failures, asked for per request (in the judged text) or for the server (``POST /control``):
``judge-fail=<status>`` in the text: that request always gets the status with an OpenAI-style error
body (``{"error": {"message": ...}}``); ``{"fail_next": n, "status": 429, "retry_after": 1}``: the
next n requests; ``{"down_for": s, "status": 503, "retry_after": 2}``: every request for the next s
seconds (an outage, then recovery); ``{"fail_always": 500}`` (0 turns it off); ``{"delay": s}``:
wait before answering; ``{"refuse_structured": true}``: 400 for any ``response_format``. A 429 or
503 carries ``Retry-After`` when one was given.

Its own log (``GET /log``): every chat request as ``{"t", "digest", "status", "retry_after"}``
(``t`` the server's wall time on arrival; ``digest`` the SHA-256 of the body; ``retry_after`` what
the answer asked), in arrival order, so a test can check how clients paced their tries.

Counting (``GET /stats``): requests received, **served** (answered 200 to a client still
connected), abandoned (the client went away before the answer: the handler is cancelled, as vLLM
aborts a request whose client disconnects), served per request-body digest, in flight now and the
most ever, statuses, and the images received.

Run it as ``python -m tests.support.judge_standin --port 0``; it prints ``PORT <n>`` when it
listens. :class:`JudgeStandin` starts and stops it from a test.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.support.standin_process import StandinProcess, serve

_GRADE = re.compile(r"grade=([-+]?\d+(?:\.\d+)?)")
_VOTES = re.compile(r"votes=([-+\d.,]+)")
_FAIL = re.compile(r"judge-fail=(\d{3})")
_USAGE = re.compile(r"judge-usage=(\S+)")
_ECHO = re.compile(r"judge-echo=(after|before)")
_PAD = re.compile(r"judge-(pad|chunked)=(\d+)")
_SIGNATURES = {b"\x89PNG": "image/png", b"\xff\xd8\xff": "image/jpeg", b"RIFF": "image/webp"}


class State:
    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self.received = 0
        self.served = 0
        self.abandoned = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.by_digest: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.images: list[dict[str, Any]] = []
        self.bodies: list[dict[str, Any]] = []
        self.fail_next = 0
        self.fail_status = 500
        self.retry_after: str | None = None
        self.fail_always = 0
        self.delay = 0.0
        self.refuse_structured = False
        self.down_until = 0.0
        self.log: list[dict[str, Any]] = []


def _error(status: int, message: str, retry_after: str | None = None) -> web.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else None
    body = {"error": {"message": message, "type": "standin_error", "code": status}}
    return web.json_response(body, status=status, headers=headers)


def _texts_and_images(messages: Any, state: State) -> tuple[str, int]:
    """The user text of the request (every text part) and the number of images, recording each image."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    texts, images = [], 0
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ValueError(f"bad message {m!r:.80}")
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise ValueError("content must be a string or a list of parts")
        for part in content:
            if part.get("type") == "text":
                texts.append(str(part["text"]))
            elif part.get("type") == "image_url":
                url = part["image_url"]["url"]
                head, _, payload = url.partition(",")
                if not head.startswith("data:image/") or not head.endswith(";base64"):
                    raise ValueError(f"image_url must be a base64 data URL, got {url[:40]!r}")
                data = base64.b64decode(payload, validate=True)
                mime = head[len("data:") : -len(";base64")]
                if not any(data.startswith(sig) and mime == t for sig, t in _SIGNATURES.items()):
                    raise ValueError(f"image bytes do not match {mime}")
                state.images.append({"mime": mime, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
                images += 1
            else:
                raise ValueError(f"unknown content part type {part.get('type')!r}")
    return "\n".join(texts), images


def _score(text: str) -> float:
    grades = _GRADE.findall(text)
    if grades:
        return float(grades[-1])
    ref = re.search(r"Reference answer:\s*(.*?)\n\s*\n", text, flags=re.DOTALL)
    ans = re.search(r"Model's answer:\s*(.*?)(\n\s*\n|$)", text, flags=re.DOTALL)
    if ref and ans:
        return 1.0 if ref.group(1).strip() and ref.group(1).strip() in ans.group(1) else 0.0
    return 0.0


def _schema_answer(schema: dict[str, Any], score: float) -> Any:
    if schema.get("type") == "object":
        return {name: _schema_answer(sub, score) for name, sub in schema["properties"].items()}
    enum = schema.get("enum")
    if enum and isinstance(enum[0], str):
        return enum[0] if score >= 0.5 else enum[-1]
    if enum:
        return min(enum, key=lambda v: abs(v - score))
    return score


def _answered(text: str) -> str:
    """The judged model's answer in the prompt (what a judge would quote)."""
    ans = re.search(r"Model's answer:\s*(.*?)(\n\s*\n|$)", text, flags=re.DOTALL)
    return ans.group(1).strip() if ans else text


def _answer(body: dict[str, Any], text: str, score: float) -> str:
    echo = _ECHO.search(text)
    if echo:
        shown = int(score) if float(score).is_integer() else score
        quote = f"The response says: {_answered(text)!r}."
        return f"Score: {shown}\n{quote}" if echo.group(1) == "after" else f"{quote}\nScore: {shown}"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return json.dumps(_schema_answer(fmt["json_schema"]["schema"], score))
    shown = int(score) if float(score).is_integer() else score
    if "JSON object" in text:
        m = re.search(r'\{"([\w.]+)"', text)
        field = m.group(1) if m else "score"
        return f'I compared the answer with the reference.\n```json\n{{"{field}": {json.dumps(shown)}}}\n```'
    return f"I compared the answer with the reference; it is {'right' if score >= 0.5 else 'wrong'}.\nScore: {shown}"


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def chat(request: web.Request) -> web.StreamResponse:
    state: State = request.app["state"]
    state.received += 1
    if state.api_key is not None and request.headers.get("Authorization") != f"Bearer {state.api_key}":
        state.statuses[401] += 1
        return _error(401, "invalid or missing API key")
    try:
        body = await request.json()
        if not isinstance(body.get("model"), str):
            raise ValueError("model is required")
        text, images = _texts_and_images(body.get("messages"), state)
        n = int(body.get("n", 1))
        if not 1 <= n <= 16:
            raise ValueError("n must be in 1..16")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        state.statuses[400] += 1
        return _error(400, f"bad request: {exc}")
    state.bodies.append(body)
    entry: dict[str, Any] = {"t": time.time(), "digest": _digest(body), "status": 200, "retry_after": None}
    state.log.append(entry)
    failing = _FAIL.search(text)
    status = int(failing.group(1)) if failing else 0
    if not status and entry["t"] < state.down_until:
        status = state.fail_status
    if not status and state.fail_next > 0:
        state.fail_next -= 1
        status = state.fail_status
    status = status or state.fail_always
    if not status and state.refuse_structured and "response_format" in body:
        status = 400
    if status:
        state.statuses[status] += 1
        message = "response_format is not supported by this server" if status == 400 else f"injected {status}"
        retry_after = state.retry_after if status in (429, 503) else None
        entry.update(status=status, retry_after=None if retry_after is None else float(retry_after))
        return _error(status, message, retry_after)
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    try:
        if state.delay:
            await asyncio.sleep(state.delay)
    except asyncio.CancelledError:
        state.abandoned += 1
        raise
    finally:
        state.in_flight -= 1
    score = _score(text)
    votes = _VOTES.findall(text)
    choices: list[dict[str, Any]] = []
    for i in range(n):
        s = float(votes[-1].split(",")[i % len(votes[-1].split(","))]) if votes else score
        choices.append(
            {"index": i, "message": {"role": "assistant", "content": _answer(body, text, s)}, "finish_reason": "stop"}
        )
    prompt_tokens = len(text.split()) + 85 * images
    completion_tokens = sum(len(c["message"]["content"].split()) for c in choices)
    state.served += 1
    state.by_digest[_digest(body)] += 1
    state.statuses[200] += 1
    usage: Any = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    hostile = _USAGE.search(text)
    if hostile:
        value = json.loads(hostile.group(1))
        usage = {**usage, "prompt_tokens": value} if isinstance(value, (int, float)) else value
    reply = {"id": f"chatcmpl-{state.served}", "object": "chat.completion", "model": body["model"]}
    pad = _PAD.search(text)
    if pad:
        return await _padded(request, {**reply, "choices": choices}, int(pad.group(2)), pad.group(1) == "chunked")
    return web.Response(text=json.dumps({**reply, "choices": choices, "usage": usage}), content_type="application/json")


async def _padded(request: web.Request, reply: dict[str, Any], size: int, chunked: bool) -> web.StreamResponse:
    """``reply`` as a body of ``size`` bytes (its ``usage`` field a long run of spaces), streamed."""
    head = json.dumps(reply)[:-1].encode() + b', "usage": "'
    tail = b'"}'
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    if not chunked:
        resp.content_length = size
    await resp.prepare(request)
    await resp.write(head)
    left, block = size - len(head) - len(tail), b" " * (1 << 16)
    try:
        while left > 0:
            await resp.write(block[: min(left, len(block))])
            left -= len(block)
        await resp.write(tail)
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        request.app["state"].abandoned += 1
        raise
    return resp


async def stats(request: web.Request) -> web.Response:
    s: State = request.app["state"]
    return web.json_response(
        {
            "received": s.received,
            "served": s.served,
            "abandoned": s.abandoned,
            "in_flight": s.in_flight,
            "max_in_flight": s.max_in_flight,
            "by_digest": dict(s.by_digest),
            "statuses": {str(k): v for k, v in s.statuses.items()},
            "images": s.images,
        }
    )


async def bodies(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].bodies)


async def log(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].log)


async def control(request: web.Request) -> web.Response:
    s: State = request.app["state"]
    body = await request.json()
    if body.get("reset"):
        request.app["state"] = State(s.api_key)
        return web.json_response({"ok": True})
    s.fail_next = int(body.get("fail_next", s.fail_next))
    s.fail_status = int(body.get("status", s.fail_status))
    if "retry_after" in body:
        s.retry_after = None if body["retry_after"] is None else str(body["retry_after"])
    s.fail_always = int(body.get("fail_always", s.fail_always))
    if "down_for" in body:
        s.down_until = time.time() + float(body["down_for"])
    s.delay = float(body.get("delay", s.delay))
    s.refuse_structured = bool(body.get("refuse_structured", s.refuse_structured))
    return web.json_response({"ok": True})


def make_app(api_key: str | None = None) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app["state"] = State(api_key)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    app.router.add_get("/bodies", bodies)
    app.router.add_get("/log", log)
    app.router.add_post("/control", control)
    return app


class JudgeStandin(StandinProcess):
    """The stand-in as a child process: ``base_url`` (with /v1), :meth:`stats`, :meth:`bodies`,
    :meth:`control`, :meth:`stop`."""

    def __init__(self, tmp: Path, api_key: str | None = None) -> None:
        args = ["--api-key", api_key] if api_key is not None else []
        super().__init__("tests.support.judge_standin", tmp / "judge-standin.log", *args)
        self.base_url = self.root + "/v1"

    def genrm_config(self, folder: Path, model: str = "judge-model", **options: Any) -> Path:
        """A rewardq config file (``folder/genrm.yaml``, as a user writes one) switching workers to
        genrm against this judge, with ``options`` beside ``base_url`` and ``model``."""
        path = folder / "genrm.yaml"
        manager_options = {"base_url": self.base_url, "model": model, **options}
        path.write_text(yaml.safe_dump({"manager": "genrm", "manager_options": manager_options}))
        return path

    def bodies(self) -> list[dict[str, Any]]:
        """Every request body the stand-in accepted, in order."""
        bodies: list[dict[str, Any]] = self.call("/bodies")
        return bodies


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    # handler_cancellation: a handler whose client disconnects is cancelled (counted as abandoned)
    asyncio.run(serve(make_app(args.api_key), args.port, handler_cancellation=True))
