"""SandboxFusion: run each test case through a remote ``run_code`` endpoint, as verl does.

:class:`SandboxFusionClient` speaks the protocol of verl's ``sandbox_fusion`` module: one
``POST <url>`` per test case with the same JSON fields (``code``, ``stdin``,
``compile_timeout``, ``run_timeout``, ``memory_limit_MB``, ``language``, ``files``,
``fetch_files``) and an HTTP timeout of compile + run + 10 s. :func:`classify` reads the
answer with verl's rules (``True``, ``False``, ``-1`` sandbox error, ``-2`` runtime error,
``-3`` timeout, ``-4`` compile error), and :func:`score_sandbox_fusion` scores like verl's
``compute_score(continuous=True)``: the fraction of the first 10 cases that pass, every case
after a compile error counted as one.

Where rewardq differs on purpose:

* **Concurrency holds across the fleet.** Each request holds one of ``max_concurrent`` slots
  of a fleet limiter (:class:`rewardq.reward.ratelimit.FleetRateLimiter`, state in Redis);
  verl's semaphore is per process.
* **A sandbox that cannot be reached is a failure, not a zero.** A request is sent once: a
  connection error, a timeout, a 5xx or a reply that is not JSON raises
  :class:`~rewardq.errors.SandboxUnavailableError` naming the sandbox, a ``transient`` failure the
  worker retries in place (with backoff) until its ``retry_for`` runs out, then an error result; a
  4xx is one of the kind its status says (401, 403, 404: ``config``). verl retries a few times
  (linear back-off) and then scores the case as failed, training the policy on a sandbox outage.
  (A reply in which the sandbox reports its own failure, ``SandboxError``, is scored as verl
  scores it: the case fails.)
* Only the cases that count are sent (the first 10); verl also runs the rest, whose results
  it then ignores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from rewardq.errors import SandboxUnavailableError
from rewardq.reward.codeexec.cases import InvalidTestCases, call_wrapper_source, extract_fenced_code, parse_test_cases
from rewardq.reward.codeexec.result import CODE_MAX_CASES, PASSED, CaseOutcome, CodeResult, summarize
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.http import retry_after_seconds, status_failure_kind

if TYPE_CHECKING:
    import aiohttp


#: Seconds added to compile + run timeout for one run_code HTTP request (verl's API_TIMEOUT).
SANDBOX_FUSION_API_TIMEOUT = 10

logger = logging.getLogger("rewardq.reward.codeexec")

BACKEND = "sandbox_fusion"


class SandboxFusionClient:
    """An asyncio client of one SandboxFusion ``run_code`` endpoint.

    Args:
        url: the endpoint, e.g. ``http://sandbox:8080/run_code``.
        limiter: an object with ``slot()`` (an async context manager), normally the fleet
            limiter whose ``max_concurrent`` is ``sandbox_fusion_max_concurrent``; None: no limit.
        max_concurrent: requests in flight from this process (also the connection-pool size).
    """

    def __init__(
        self,
        url: str,
        *,
        limiter: Any = None,
        max_concurrent: int = CodeExecSettings.sandbox_fusion_max_concurrent,
    ) -> None:
        self.url = url
        self.limiter = limiter
        self._local = asyncio.Semaphore(max_concurrent)
        self._max_concurrent = max_concurrent
        self._session: aiohttp.ClientSession | None = None

    async def _http(self) -> Any:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._max_concurrent))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        async with self._local:  # waiters queue here, not in Redis
            if self.limiter is None:
                yield
            else:
                async with self.limiter.slot():
                    yield

    async def run_code(
        self,
        code: str,
        stdin: str | None,
        *,
        compile_timeout: float,
        run_timeout: float,
        memory_limit_mb: int,
        language: str = "python",
    ) -> dict[str, Any]:
        """One ``run_code`` request (holding a concurrency slot); the answer's JSON.

        Raises:
            SandboxUnavailableError: see the module docstring.
        """
        import aiohttp

        payload = {
            "compile_timeout": compile_timeout,
            "run_timeout": run_timeout,
            "code": code,
            "stdin": stdin,
            "memory_limit_MB": memory_limit_mb,
            "language": language,
            "files": {},
            "fetch_files": [],
        }
        timeout = aiohttp.ClientTimeout(total=compile_timeout + run_timeout + SANDBOX_FUSION_API_TIMEOUT)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        body = json.dumps(payload)
        session = await self._http()
        try:
            async with self._slot(), session.post(self.url, data=body, headers=headers, timeout=timeout) as resp:
                if resp.status >= 400:
                    text = (await resp.text())[:300]
                    retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
                    raise self._error(f"answered HTTP {resp.status} ({text!r})", resp.status, retry_after)
                try:
                    answer = await resp.json(content_type=None)
                except ValueError as exc:
                    raise self._error(f"answered with something that is not JSON ({exc})") from None
                if not isinstance(answer, dict):
                    raise self._error(f"answered with a JSON {type(answer).__name__}, not an object")
                return answer
        except aiohttp.ClientConnectionError as exc:
            raise self._error(f"could not be reached ({type(exc).__name__}: {exc})") from None
        except asyncio.TimeoutError:
            raise self._error(f"did not answer within {timeout.total:g}s") from None

    def _error(self, what: str, status: int | None = None, retry_after: float | None = None) -> SandboxUnavailableError:
        """The failure: ``transient`` (no answer, a 5xx, an answer that is not JSON) unless an HTTP
        status says otherwise (:func:`~rewardq.reward.http.status_failure_kind`: 401, 403, 404 ``config``)."""
        return SandboxUnavailableError(
            f"SandboxFusion at {self.url} {what}. Check that the sandbox is running and that "
            "sandbox_fusion_url points at its run_code endpoint; this trajectory was not scored",
            failure_kind=None if status is None else status_failure_kind(status),
            retry_after=retry_after,
        )


async def _all_or_none(coros: list[Any]) -> list[CaseOutcome]:
    """Await every case; the first failure cancels the others (a down sandbox fails them all anyway)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def classify(answer: dict[str, Any], expected: object) -> CaseOutcome:
    """verl's reading of one ``run_code`` answer for a case whose expected output is ``expected``."""
    status = answer.get("status")
    compiled = answer.get("compile_result") or None
    ran = answer.get("run_result") or None
    if status == "SandboxError":
        return CaseOutcome(-1, "sandbox_error", f"the sandbox failed: {answer.get('message', '')}"[:300])
    if status == "Failed":
        c_status = compiled.get("status") if compiled else None
        if compiled and (
            c_status in ("Error", "TimeLimitExceeded") or (c_status == "Finished" and compiled.get("return_code") != 0)
        ):
            kind = "compile timeout" if c_status == "TimeLimitExceeded" else "compile error"
            return CaseOutcome(-4, "compile_error", f"{kind}: {str(compiled.get('stderr') or '')[-300:]}")
        if ran:
            r_status = ran.get("status")
            if r_status == "TimeLimitExceeded":
                return CaseOutcome(-3, "timeout", "timed out")
            if r_status == "Error" or (r_status == "Finished" and ran.get("return_code") != 0):
                tail = str(ran.get("stderr") or "").strip().splitlines()[-1:] or [f"exit code {ran.get('return_code')}"]
                return CaseOutcome(-2, "runtime_error", tail[0][:300])
            return CaseOutcome(-1, "sandbox_error", f"unexpected run status {r_status!r}")
        return CaseOutcome(-1, "sandbox_error", "failed without a compile or run result")
    if status == "Success":
        if ran and ran.get("status") == "Finished":
            printed = ran.get("stdout")
            printed = "" if printed is None else printed
            if expected is None or str(printed).rstrip("\n") == str(expected).rstrip("\n"):
                return PASSED
            return CaseOutcome(False, "wrong_answer", "wrong answer")
        return CaseOutcome(-1, "sandbox_error", "success without a finished run")
    return CaseOutcome(-1, "sandbox_error", f"unknown status {status!r}")


async def score_sandbox_fusion(
    client: SandboxFusionClient,
    completion: str,
    ground_truth: object,
    *,
    memory_limit_mb: int = CodeExecSettings.sandbox_fusion_memory_limit_mb,
    timeout: float = CodeExecSettings.sandbox_fusion_run_timeout,
    max_cases: int = CODE_MAX_CASES,
) -> CodeResult:
    """Score ``completion`` as verl's ``sandbox_fusion.compute_score(continuous=True)`` does.

    Raises:
        SandboxUnavailableError: a request failed for good (see the module docstring).
    """
    code = extract_fenced_code(completion)
    if code is None:
        return CodeResult(0.0, 0, 0, "no_code", "Invalid completion (missing code block)", BACKEND)
    try:
        tc = parse_test_cases(ground_truth)
    except InvalidTestCases as exc:
        return CodeResult(0.0, 0, 0, "invalid_test_cases", str(exc), BACKEND)
    n = len(tc.inputs)
    asserts = tc.assert_case if tc.assert_case is not None else [""] * n
    if n == 0:
        return CodeResult(0.0, 0, 0, "no_cases", "", BACKEND)
    if len(tc.outputs) != n or len(asserts) != n:
        bad = CaseOutcome(-1, "invalid_test_cases", "inputs, outputs and assert cases differ in number")
        return summarize([bad] * n, BACKEND, 0, counted=max_cases)
    counted = min(n, max_cases)

    async def one(i: int) -> CaseOutcome:
        program = code + "\n\n" + str(asserts[i])
        if tc.fn_name:
            program = call_wrapper_source(program, tc.fn_name)
        stdin = None if tc.inputs[i] is None else str(tc.inputs[i])
        answer = await client.run_code(
            program, stdin, compile_timeout=timeout, run_timeout=timeout, memory_limit_mb=memory_limit_mb
        )
        outcome = classify(answer, tc.outputs[i])
        return outcome if outcome.passed else CaseOutcome(outcome.code, outcome.status, f"case {i}: {outcome.message}")

    outcomes = await _all_or_none([one(i) for i in range(counted)])
    first_compile = next((i for i, o in enumerate(outcomes) if o.code == -4), None)
    if first_compile is not None:  # verl: every later case counts as a compile error too
        outcomes[first_compile + 1 :] = [outcomes[first_compile]] * (counted - first_compile - 1)
    return summarize(outcomes, BACKEND, runs=counted)
