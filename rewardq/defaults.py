"""Every default setting of rewardq, in one place, each with what it bounds.

The CLI, the clients, the worker configuration and the operator commands import these;
nothing else repeats the literals. This module imports nothing, so ``rewardq --help``
stays instant.
"""

from __future__ import annotations

#: Where producers, workers and operator commands connect unless told otherwise.
REDIS_URL = "redis://127.0.0.1:6379/0"
#: First component of every key; two pipelines on one Redis use two namespaces.
NAMESPACE = "rewardq"
#: The consumer group every worker of a pipeline joins.
GROUP = "rewardq-workers"

#: Largest encoded record, in bytes: producers refuse larger ones, workers dead-letter them.
MAX_RECORD_BYTES = 32 * 1024 * 1024
#: Outputs one trajectory may have (indices 0 .. MAX_OUTPUTS - 1). Producers refuse a larger index,
#: workers reject it, and every Lua script is given it as the bound of its loops, so no record can
#: make a script's work grow past it.
MAX_OUTPUTS = 4096
#: Longest ``uid`` (characters); verl's uids are 36-character UUIDs.
MAX_UID_CHARS = 256
#: Longest ``session_id`` (characters); verl's session ids are small integers.
MAX_SESSION_ID_CHARS = 64
#: Longest ``key`` field of a stream entry a worker will parse or write anywhere (dead letters keep a
#: cut copy): ``<uid>_<session_id>_<index>`` with the longest uid, session id and index.
MAX_KEY_CHARS = MAX_UID_CHARS + MAX_SESSION_ID_CHARS + 24
#: Undelivered + in-flight stream entries per shard before ``put_*`` waits for workers.
MAX_BACKLOG = 100_000
#: Seconds ``put_*`` waits for the backlog to drain before raising BackpressureTimeout.
BACKPRESSURE_TIMEOUT = 60.0
#: Connections one client may open; past it a command waits for a free one.
MAX_CONNECTIONS = 256
#: Seconds a command waits for a free connection when all MAX_CONNECTIONS are busy.
POOL_TIMEOUT = 30.0

#: The reward manager a worker runs unless told otherwise (verl's default).
MANAGER = "naive"
#: Largest ``max_outputs`` a worker accepts: every Lua script's worst-case run time grows with it.
MAX_OUTPUTS_LIMIT = 1_000_000
#: Seconds a scored trajectory's outputs stay readable by ``rewardq inspect``; 0 drops them at once.
KEEP_RECORDS = 0.0
#: Worker log level, and log format (``text`` or ``json``: one object per line).
LOG_LEVEL = "INFO"
LOG_FORMAT = "text"

#: Trajectories one worker scores at once.
CONCURRENCY = 32
#: Stream entries per XREADGROUP.
BATCH_SIZE = 256
#: Milliseconds one XREADGROUP blocks waiting for entries.
BLOCK_MS = 1000
#: Seconds one trajectory's ``run_single`` may take before it is an error result.
SCORE_TIMEOUT = 300.0
#: Seconds one sympy comparison of the ``numina_*`` scorer may take before it counts as
#: "not equal" (verl's ``prime_math`` limit; each part of a tuple answer gets its own).
PRIME_MATH_SYMPY_TIMEOUT = 10.0
#: Seconds an entry stays pending before another worker may reclaim it.
CLAIM_IDLE = 60.0
#: Deliveries of one entry before it is dead-lettered.
MAX_DELIVERIES = 5
#: Seconds a trajectory stays leased to its scorer without renewal.
LEASE_SECONDS = 30.0
#: Seconds between worker heartbeats (and lease renewals).
HEARTBEAT_INTERVAL = 2.0
#: Seconds between maintenance passes (reclaim, expiry of incomplete trajectories).
MAINTENANCE_INTERVAL = 5.0
#: Seconds a trajectory may wait for its missing outputs before every key gets an error.
INCOMPLETE_TIMEOUT = 600.0
#: Seconds results and finished trajectories live in Redis; 0 keeps them forever.
RESULT_TTL = 7 * 86400.0
#: Seconds a stopping worker lets in-flight scoring finish before handing it back.
SHUTDOWN_GRACE = 30.0
#: Seconds ``wait_rewards`` waits when no timeout is given.
WAIT_TIMEOUT = 600.0
#: Seconds ``rewardq demo`` waits for its rewards.
DEMO_TIMEOUT = 300.0

#: Seconds ``rewardq worker`` waits for Redis at start-up; None waits forever (a supervisor or
#: k8s restarts workers while Redis is still coming up).
WORKER_CONNECT_TIMEOUT: float | None = None
#: Seconds one-shot commands (``status``, ``inspect``, ``dead-letters``, ``health``, ``produce``)
#: wait for Redis before they exit with code 3.
ONESHOT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for a TCP connection to Redis.
SOCKET_CONNECT_TIMEOUT = 5.0
#: Seconds a blocking client waits for the reply to one command (asyncio clients: see
#: ``rewardq.queue.connection``).
SOCKET_TIMEOUT = 30.0

#: Where a synchronous ``--reward-fn`` runs: ``process`` (scorer processes, killed on timeout),
#: ``thread`` (threads of the worker) or ``inline`` (the worker's event loop; trusted, cheap code only).
REWARD_FN_PLACEMENT = "process"
#: Every placement ``reward_fn_placement`` accepts.
REWARD_FN_PLACEMENTS = ("process", "thread", "inline")
#: Scorer processes kept ready per function; None: one per CPU core, at least 2.
SCORER_PROCESSES: int | None = None
#: Seconds a scorer process may be busy before it stops counting toward the pool's size, so
#: the calls waiting behind a hung one get a spare process instead of waiting for its timeout.
SCORER_SPARE_AFTER = 2.0
#: Calls of a thread-run reward function that may hang (their threads cannot be stopped)
#: before further calls are refused.
MAX_LOST_THREADS = 32
#: Times a trajectory may take its worker process down while scored alone before it gets an
#: error result (a crash while scored alone can only be its own doing).
MAX_CRASHES = 2
#: Seconds after ``shutdown_grace`` at which a stopping worker process exits even if threads
#: or children it cannot stop still run (SIGTERM ends the process within grace + 5 s).
EXIT_AFTER_GRACE = 4.0
#: Seconds a worker process that has stopped (everything handed back) may take to exit before
#: it exits anyway: a hung thread in asyncio's default executor would otherwise hold it forever.
EXIT_AFTER_STOP = 2.0

#: Seconds the verl adapter waits for one trajectory's rewards (``REWARDQ_VERL_TIMEOUT``); past it
#: the trajectory scores as an error (or raises, with ``REWARDQ_VERL_ON_ERROR=raise``).
VERL_TIMEOUT = 900.0

# -- code execution (data sources codecontests, apps, codeforces, taco) ------------------------
#: SandboxFusion run_code requests in flight at once across the whole fleet (verl's default).
SANDBOX_FUSION_MAX_CONCURRENT = 64
#: Memory of one program, in MB: SandboxFusion's ``memory_limit_MB`` and the local runner's
#: address-space limit (verl's default).
CODE_MEMORY_LIMIT_MB = 1024
#: SandboxFusion compile and run timeout of one test case, in seconds (verl's).
SANDBOX_FUSION_RUN_TIMEOUT = 10
#: Seconds added to compile + run timeout for one run_code HTTP request (verl's API_TIMEOUT).
SANDBOX_FUSION_API_TIMEOUT = 10
#: Attempts of one run_code request on connection errors and 5xx answers (verl's MAX_RETRIES).
SANDBOX_FUSION_ATTEMPTS = 3
#: Seconds before retry k is ``k * SANDBOX_FUSION_RETRY_DELAY`` (verl's linear back-off).
SANDBOX_FUSION_RETRY_DELAY = 1.0
#: Test cases that count toward the continuous score: the first 10, as verl counts them.
CODE_MAX_CASES = 10
#: Local runner: per-case timeout when every case runs in one process (prime_code's first pass).
CODE_FIRST_PASS_TIMEOUT = 5
#: Local runner: per-case timeout when each case runs in a process of its own (prime_code's).
CODE_CASE_TIMEOUT = 10
#: Local runner: largest file one program may write, in MB (RLIMIT_FSIZE).
CODE_FILE_SIZE_MB = 16
#: Local runner: processes the sandbox uid may have at once (RLIMIT_NPROC; bounds a fork bomb).
CODE_MAX_PROCESSES = 32
#: Local runner: bytes one run may report (its printed output, JSON-escaped), counted where it
#: is printed; a case past it fails (``output_limit``).
CODE_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
#: Local runner: bytes one job (all its runs) may send back to the worker.
CODE_MAX_JOB_OUTPUT_BYTES = 16 * 1024 * 1024
#: Local runner: a run's timeouts count the job's own time (see harness_cgroup); the wall
#: clock ends it at this many times its deadline whatever the job's time says (a job starved
#: of CPU by the host; past that, score_timeout gives an error result, never a wrong 0.0).
CODE_WALL_FACTOR = 10.0
#: Local runner: CPUs one job may use at once (its cgroup's quota), and its CPU weight
#: (equal for every job, whatever number of processes it runs).
CODE_JOB_CPUS = 1.0
#: Local runner: memory a job's cgroup allows beyond ``memory_limit_mb`` (the supervisor's own).
CODE_JOB_MEMORY_SLACK_MB = 64
#: Local runner: seconds allowed, on top of the runs' deadlines, to start and tear down a sandbox.
CODE_STARTUP_SLACK = 10.0
#: Local runner as root: each job runs as a uid of [BASE, BASE + COUNT) that no other live job
#: on this host holds (a lock file per uid in CODE_UID_LOCK_DIR).
CODE_SANDBOX_UID_BASE = 61000
CODE_SANDBOX_UID_COUNT = 4000
CODE_UID_LOCK_DIR = "/run/rewardq/sandbox-uids"
#: Local runner with namespaces: folders covered by an empty tmpfs (home folders, /run's
#: secrets, /var/tmp); every other world-writable folder found is covered too.
CODE_HIDDEN_PATHS = ("/root", "/home", "/run", "/var/tmp")
