"""Every exception rewardq raises on purpose, in one place.

Each carries a message that says what went wrong *and* what to do next, because the
people reading it are RL engineers in the middle of a training run.
"""

from __future__ import annotations


class RewardqError(Exception):
    """Base class of every error rewardq raises deliberately.

    ``exit_code`` is the code the CLI exits with for it: 2 (a setting or a permission to fix)
    unless a subclass says otherwise.
    """

    exit_code = 2


class ConfigError(RewardqError):
    """A setting is missing or wrong. The message names the setting."""


class ScoringConflict(ConfigError):
    """The namespace records another scoring configuration than this worker's (exit code 2): run the
    two side by side on two namespaces, or replace the recorded one with ``--takeover``."""


class MissingExtra(ConfigError):
    """An install extra a command needs is missing (``worker``; ``vision`` for images): the core
    install is the producer side only. Raised at start-up or on the record that needs it."""

    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(
            f"{module} is not installed; the rewardq command line and reward workers need the worker "
            "extra: pip install 'rewardq[worker]' (the core install is the producer side and the verl adapter)"
        )


class RecordError(RewardqError, ValueError):
    """A record failed to encode, decode or validate.

    Attributes:
        field: the offending field (``"prompt_ids"``, ``"index"``, ...) or ``"<record>"``.
        detail: what is wrong with it (the message without the field and without :meth:`naming`'s place).
        permanent: True when retrying can never succeed (bad input), so the entry is
            dead-lettered at once instead of after ``max_deliveries`` attempts.
        names_output: True when ``detail`` already says which output it is about (an image's
            ``"output 1, image 2 ..."``): :meth:`naming` then leaves the message as it is.
    """

    def __init__(self, field: str, message: str, *, permanent: bool = True, names_output: bool = False) -> None:
        self.field = field
        self.detail = message
        self.permanent = permanent
        self.names_output = names_output
        super().__init__(f"{field}: {message}")

    def naming(self, where: str) -> RecordError:
        """This error, its message now saying where the field is (``"output u_s_3"``): the field, the
        detail, then the place in parentheses, so the message without a place still reads as before
        (``"response_ids: token id -7 is negative (output u_s_3)"``). An error whose detail names its
        output already (:attr:`names_output`) keeps its message, so the output is named once.
        Returns the same error, to be raised again."""
        if not self.names_output:
            self.args = (f"{self.field}: {self.detail} ({where})",)
        return self


class TokenizerMismatch(RecordError):
    """A record's ids were made with another tokenizer than the worker decodes with (field ``tokenizer``)."""

    def __init__(self, message: str) -> None:
        super().__init__("tokenizer", message)


class ScoringError(RewardqError):
    """A reward manager or scoring function failed or returned something unusable.

    Its trajectory gets an error result whose ``failure_kind`` (a
    :class:`~rewardq.queue.states.FailureKind`) the class decides
    (:func:`rewardq.queue.states.failure_kind_of`: ``scorer`` unless a subclass says otherwise), or
    the raiser, with ``failure_kind=``, when one class covers several kinds (an HTTP status decides).

    Attributes:
        failure_kind: the kind the raiser gave (a ``FailureKind`` value), None: the class's.
        retry_after: for a ``transient`` failure, the seconds the remote side asked to wait
            (``Retry-After``) before the next try, None when it did not say.
        extra_info: more ``reward_extra_info`` for the error result (beside ``error``): the fields
            verl's managers give such a failure (``{"timeout": True, "acc": 0.0}``), so readers of
            ``reward_extra_info`` find them.
    """

    def __init__(
        self,
        *args: object,
        failure_kind: str | None = None,
        retry_after: float | None = None,
        extra_info: dict[str, object] | None = None,
    ) -> None:
        super().__init__(*args)
        self.failure_kind = failure_kind
        self.retry_after = retry_after
        self.extra_info = extra_info


class TransientError(ScoringError):
    """Scoring failed on infrastructure that may recover: a judge or reward model answering 429 or
    5xx or not answering, SandboxFusion down, a lost connection (``failure_kind`` ``transient``).

    The worker scores the trajectory again after a backoff (``retry_after`` when the remote side
    said how long to wait), without holding a scoring slot, until ``retry_for`` runs out; only
    then does it get an error result. A reward function may raise it too, for the same effect.
    """


class ScoringTimeout(ScoringError):
    """Scoring ran past its budget (``score_timeout``, or a manager's own ``timeout``) on this
    trajectory (``failure_kind`` ``timeout``)."""


class FleetConfigError(ScoringError):
    """The fleet cannot score this trajectory as configured, whatever is retried (``failure_kind``
    ``config``): a data source no scorer knows, a missing extra, code isolation unavailable, a
    judge refusing the credentials or the model (401, 403, 404). The message says what to change."""


class RunStopped(ScoringError):
    """rewardq stopped a verl run: a failure the fleet cannot get past by itself (a ``config``
    failure, the run's failure budget spent, ``verl_on_error=raise``), or a setting that cannot
    work. The message names the cause and the fix. On verl's V1 trainer it is also handed to the
    trainer through its replay buffer (:mod:`rewardq.integrations.verl.stop`)."""


class SampleMasked(ScoringError):
    """One sample of a verl run got no reward and is left out of training (``verl_on_error=mask``
    on verl's V1 trainer, which leaves a session that raised out of TransferQueue). Nothing stops."""


class ResultError(ScoringError):
    """A manager's result cannot be stored: its ``reward_extra_info`` holds a cycle, nests too deep,
    has two keys that become one in JSON, cannot be turned into JSON, or the key's result is over
    ``max_result_bytes``. Only that trajectory fails; the message names the key, the path and the limit."""


class TrajectoryTooLarge(RecordError):
    """A trajectory is over ``max_trajectory_bytes`` (its records) or ``max_batch_bytes`` (the padded
    batch its manager would receive). Every key gets an error result naming the limit."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__("outputs", message)


class RemoteTraceback(RewardqError):
    """The traceback of an exception raised in a scorer process, as text.

    Attached as the ``__cause__`` of the :class:`ScoringError` raised in the worker, so the
    worker's log and the dead letter show the line of the reward function that failed: read
    it there, fix the function, then ``rewardq dead-letters retry``.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)

    def __str__(self) -> str:
        return f"\n{self.text}"


class UnknownDataSourceError(FleetConfigError):
    """No default scorer exists for a ``data_source``."""


class MissingScorerExtra(FleetConfigError):
    """A built-in scorer needs a package of the ``math`` extra that is not installed: that sample's
    trajectory gets an error result whose message names the extra to install."""


class CodeSandboxError(FleetConfigError):
    """The local code sandbox failed, not the program under test (it could not start, set up its
    namespaces, or report): the trajectory gets an error result instead of a reward, of kind
    ``config`` (code isolation is unavailable on this host) unless the raiser says otherwise."""


class SandboxUnavailableError(TransientError):
    """SandboxFusion did not answer usably (connection refused, a 5xx, a timeout or a reply that is
    not JSON: ``transient``, retried in place; a 4xx: ``config`` or ``scorer``, as the raiser says):
    the trajectory never gets a fake zero reward."""


class UnknownManagerError(ConfigError):
    """``--manager`` names no registered manager and is not ``module:Class``."""


class BackpressureTimeout(RewardqError, TimeoutError):
    """The stream backlog stayed above ``max_backlog`` for longer than the producer would wait."""


class RewardTimeout(RewardqError, TimeoutError):
    """``wait_rewards`` ran out of time. ``missing`` lists the keys still without a result."""

    def __init__(self, missing: list[str], timeout: float) -> None:
        self.missing = list(missing)
        shown = ", ".join(self.missing[:10]) + (" ..." if len(self.missing) > 10 else "")
        super().__init__(
            f"{len(self.missing)} key(s) still have no reward after {timeout:g}s: {shown}. "
            "Check that workers are running (`rewardq status`) and that every output of "
            "these trajectories, including the final one, was pushed."
        )


class RedisUnavailable(RewardqError):
    """Redis could not be reached or refused us. The CLI exits with code 3 for it.

    ``retryable`` is True when waiting may help (the server did not answer), False when it
    cannot (refused credentials, a malformed URL).
    """

    exit_code = 3
    retryable = False


class PutError(RewardqError):
    """A ``put_*`` call failed in Redis; the message says what happened, whether anything of the call
    was written, and what to do. It never holds the record's bytes.

    Attributes:
        keys: the output keys the call was putting.
        written: False when nothing of this call was written, None when that is unknown (the reply
            never came). Outputs put by *earlier* calls stay queued either way.

    The CLI exits with code 3 for it, as for an unreachable Redis.
    """

    exit_code = 3

    def __init__(self, message: str, *, keys: list[str], written: bool | None) -> None:
        self.keys = list(keys)
        self.written = written
        super().__init__(message)


class RedisOutOfMemory(PutError):
    """Redis refused the write: its memory is past ``maxmemory`` (with a ``noeviction`` policy, as
    a queue must use). Raise ``maxmemory``, or let workers drain the backlog, then put again."""


class RedisTimeout(PutError, RedisUnavailable, TimeoutError):
    """Redis did not answer a ``put_*`` in time (a stalled or overloaded server). Whether the call
    was applied is unknown; putting the same outputs again is safe (a record sent twice is scored once)."""

    retryable = True


class RedisConnectionLost(PutError, RedisUnavailable, ConnectionError):
    """Redis could not be reached for a ``put_*`` after the retry policy's attempts."""

    retryable = True


class RedisPermissionError(RewardqError):
    """The Redis ACL user may not run a command or touch a key rewardq needs. Exit code 2:
    restarting does not help, granting the permission does."""

    exit_code = 2


class NotFound(RewardqError):
    """What a command was asked about does not exist (a namespace, a key, a dead letter). Exit code 1."""

    exit_code = 1


class ReplayStopped(RewardqError):
    """``rewardq replay`` stopped before every trajectory had its result: one got none within its
    ``--timeout``, or the replay's worker stopped. Exit code 1, as for an interrupted replay: what
    was scored is in ``--out``, and a run with the same ``--out`` goes on from there."""

    exit_code = 1


class DemoError(RewardqError):
    """The demo could not run (a worker died at start-up, workers never became ready, ...)."""


class JsonlLineError(RewardqError, ValueError):
    """One bad line of a JSONL file of trajectories (:mod:`rewardq.producers.jsonl`).

    Attributes:
        line: 1-based line number.
        field: the offending field, e.g. ``outputs[2].response_mask`` or ``<json>``.
        reason: what is wrong with it.
    """

    def __init__(self, line: int, field: str, reason: str) -> None:
        self.line, self.field, self.reason = line, field, reason
        super().__init__(f"line {line}: {field}: {reason}")
