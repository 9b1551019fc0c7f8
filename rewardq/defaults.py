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
#: Largest encoded image (PNG/JPEG/WebP bytes) a record may carry, in bytes: producers refuse larger
#: ones naming the output and the image, workers dead-letter them. The record as a whole is also
#: bounded by MAX_RECORD_BYTES.
MAX_IMAGE_BYTES = 16 * 1024 * 1024
#: Outputs one trajectory may have (indices 0 .. MAX_OUTPUTS - 1). Producers refuse a larger index,
#: workers reject it, and every Lua script is given it as the bound of its loops, so no record can
#: make a script's work grow past it.
MAX_OUTPUTS = 4096
#: Longest ``uid``, in bytes of UTF-8 (Redis counts key lengths in bytes, so every limit on a key
#: does too); verl's uids are 36-character UUIDs.
MAX_UID_BYTES = 256
#: Longest ``session_id``, in bytes of UTF-8; verl's session ids are small integers.
MAX_SESSION_ID_BYTES = 64
#: Longest ``key`` field of a stream entry a worker will parse or write anywhere (dead letters keep a
#: cut copy), in bytes: ``<uid>_<session_id>_<index>`` with the longest uid, session id and index.
MAX_KEY_BYTES = MAX_UID_BYTES + MAX_SESSION_ID_BYTES + 24
#: Largest sum of the encoded records of one trajectory, in bytes. ``put_trajectory`` refuses a
#: larger trajectory before anything is written; workers stop storing a trajectory's outputs once
#: they pass it and give every key an error result. A trajectory of this size decodes to about as
#: much worker memory, so it bounds what one trajectory can cost Redis and a worker. 256 MiB is
#: 8 records of the largest size (``MAX_RECORD_BYTES``), or 4,096 outputs of ~16k tokens each,
#: far past the agent trajectories of a real run (tens of MB at most).
MAX_TRAJECTORY_BYTES = 256 * 1024 * 1024
#: Largest padded batch (the ``TensorDict`` one trajectory's manager receives), in bytes, computed
#: from the outputs' lengths before anything is allocated. Padding multiplies: 4,096 outputs padded
#: to one 8M-token response would take ~1 TB. 1 GiB holds a batch of 64 outputs of 128k-token
#: prompts and 128k-token responses; a larger one is refused with an error result naming it.
MAX_BATCH_BYTES = 1024 * 1024 * 1024
#: Largest result of one output key, in bytes as stored (``reward_extra_info``'s JSON and the other
#: fields of its hash). A larger one becomes an error result naming this limit and the size. The
#: default extra info of every built-in scorer is under 1 KiB; 1 MiB leaves room for a full decoded
#: response (a 256k-token answer) or a code run's captured output in ``reward_extra_info``, while a
#: 300-output trajectory of maximal results (one result copied to every key) still costs Redis
#: at most 300 MiB, written in bounded chunks.
MAX_RESULT_BYTES = 1024 * 1024
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
#: Largest ``max_result_bytes`` a worker accepts: Redis refuses a string over 512 MiB (``proto-max-bulk-len``).
MAX_RESULT_BYTES_LIMIT = 512 * 1024 * 1024
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
#: Seconds a trajectory whose scoring failed for a ``transient`` reason (a judge answering 503,
#: SandboxFusion down) keeps being scored again, counted from its first such failure, before it
#: becomes an error result of kind ``transient``: long enough to ride out a judge or sandbox restart.
RETRY_FOR = 300.0
#: The first pause before a transient failure is scored again, and the longest (before jitter): the
#: pause doubles from the first to the longest unless the server said how long (``Retry-After``).
RETRY_BACKOFF_BASE = 1.0
RETRY_BACKOFF_CAP = 30.0
#: Share of each pause drawn at random (the pause is ``step * (1 - RETRY_JITTER * r)``), and the
#: share of a ``Retry-After`` added at random past it, so trajectories that failed together do not
#: come back together.
RETRY_JITTER = 0.5
#: Trajectories one worker holds waiting on a retry, per ``concurrency`` slot: they hold no scoring
#: slot (other trajectories keep flowing), but the worker reads no more while this many wait.
RETRY_WAITING_PER_SLOT = 4
#: Seconds an entry stays pending before another worker may reclaim it.
CLAIM_IDLE = 60.0
#: Deliveries of one entry (its first read, then each reclaim or hand-back) before its trajectory is
#: dead-lettered with an error result for every key, naming what became of the earlier attempts.
MAX_DELIVERIES = 5
#: Seconds a trajectory stays leased to its scorer without renewal.
LEASE_SECONDS = 30.0
#: Seconds between worker heartbeats (and lease renewals).
HEARTBEAT_INTERVAL = 2.0
#: Whether a worker whose scoring configuration differs from the one its namespace records takes the
#: namespace over (a rolling upgrade: it waits until no live worker runs the recorded one, then
#: records its own) instead of refusing to start.
TAKEOVER = False
#: Seconds between a waiting ``--takeover`` worker's looks at the live workers (and its log lines).
TAKEOVER_POLL = 1.0
TAKEOVER_LOG_EVERY = 10.0
#: Seconds between maintenance passes (reclaim, expiry of incomplete trajectories).
MAINTENANCE_INTERVAL = 5.0
#: Seconds a trajectory may wait for its missing outputs before every key gets an error.
INCOMPLETE_TIMEOUT = 600.0
#: Seconds results and finished trajectories live in Redis; 0 keeps them forever.
RESULT_TTL = 7 * 86400.0
#: Seconds the records of an ended trajectory (scored or failed) are kept for ``rewardq inspect`` and
#: ``rewardq dead-letters retry``; 0 deletes them as soon as the result is written. Off by default:
#: kept records cost as much memory as the traffic of that many seconds.
KEEP_RECORDS = 0.0

#: Seconds a worker's ledger spool segment collects trajectories before it is written as one Parquet
#: file (rewardq.ledger): fewer, larger files against fresher ledgers. At 60 s a 1,000-GPU run with
#: 100 workers makes ~144,000 files a day, 6,000 an hour.
LEDGER_FLUSH_INTERVAL = 60.0
#: Bytes of spool after which a segment is written early, whatever its age (one Parquet file each).
LEDGER_FILE_BYTES = 128 * 1024 * 1024
#: Spooled bytes not yet written (the ledger's destination refusing files) past which a worker stops
#: spooling and counts trajectories as unwritten, rather than fill its disk.
LEDGER_SPOOL_MAX_BYTES = 10 * 1024**3
#: Trajectories ``rewardq replay`` keeps in flight at once (each waits for its result).
REPLAY_WINDOW = 64
#: The largest reward changes ``rewardq diff`` lists.
DIFF_TOP = 10
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
#: Scorer processes per function of the managers ``rewardq.testing`` builds (a test needs one).
TESTING_SCORER_PROCESSES = 1
#: Seconds a scorer process may be busy on one call before it may count as stuck (no longer
#: toward the pool's size), so the calls waiting behind a hung one get a spare process instead of
#: waiting for its timeout. A call's own budget can make it sooner (``SCORER_SPARE_SHARE``).
SCORER_SPARE_AFTER = 2.0
#: Share of a call's budget (the trajectory's ``score_timeout``) after which its busy process may
#: count as stuck, when that comes before ``SCORER_SPARE_AFTER``.
SCORER_SPARE_SHARE = 0.25
#: A busy process past that point counts as stuck only when its call used less CPU than this
#: share of its wall time (it sleeps or waits: a hang), or CPU time beyond the same point (it
#: spins). A call that only waits for a core on a loaded machine keeps its process counted.
SCORER_STUCK_CPU_SHARE = 0.05
#: Spare scorer processes per function at most, beyond ``scorer_processes``.
SCORER_SPARES = 2
#: Seconds a process beyond the pool's size stays idle before it exits (a burst that comes back
#: within that finds it ready, instead of starting and importing another).
SCORER_SPARE_IDLE = 30.0
#: Bytes of a scorer process's stdout, and of its stderr, that reach the worker's log per call;
#: the rest are counted, dropped, and the drop logged.
SCORER_OUTPUT_CAP = 64 * 1024
#: Seconds a scorer process waits, after a call, for what its killed leftover children held.
SCORER_CHILD_REAP = 1.0
#: Seconds a scorer process waits, after a call, for its output thread to read what the call wrote.
SCORER_OUTPUT_DRAIN = 1.0
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

#: Seconds a worker's last heartbeat may be old for it to count as alive (``rewardq health``,
#: ``rewardq demo`` waiting for its workers).
HEALTH_MAX_AGE = 10.0
#: Shard count of a namespace that does not exist yet.
SHARDS = 1
#: Entries a shard's ``done`` stream keeps (approximately): the latest finished trajectories.
DONE_MAXLEN = 100_000
#: Entries a shard's dead-letter stream keeps (approximately).
DEAD_MAXLEN = 1_000_000
#: Trajectories one maintenance pass of one shard ends for missing outputs, at most.
EXPIRE_BATCH = 100

# -- retries and backoff (rewardq.backoff.compute_backoff) --------------------------------------
#: Longest pause (seconds) of the worker's reader after failed reads in a row.
READ_BACKOFF_CAP = 5.0
#: First and longest pause (seconds) between the start-up pings of a process waiting for Redis.
CONNECT_BACKOFF_BASE = 0.5
CONNECT_BACKOFF_CAP = 5.0
#: Seconds one start-up ping of Redis may take (connection and reply).
PROBE_TIMEOUT = 3.0
#: ``rewardq worker --processes``: the first and longest pause before a dead child is restarted
#: (it doubles with each death in a row), and how long a child must stay up for the next death to
#: start from the first pause again.
SUPERVISOR_BACKOFF_START = 1.0
SUPERVISOR_BACKOFF_MAX = 30.0
SUPERVISOR_STABLE_AFTER = 30.0
#: Seconds beyond a child's ``shutdown_grace`` before the supervisor kills a child that has not stopped.
SUPERVISOR_KILL_SLACK = 10.0
#: Seconds between the supervisor's checks of its children.
SUPERVISOR_POLL = 0.1

# -- operator commands ---------------------------------------------------------------------------
#: Waiting trajectories ``rewardq status`` lists.
STATUS_WAITING_LIMIT = 20
#: Seconds of finished trajectories ``rewardq status`` measures its rates over.
STATUS_RATE_WINDOW = 60.0
#: Dead letters of one shard ``rewardq status`` still reads to count them by kind (beyond: the total only).
STATUS_DEAD_LETTER_SCAN = 10_000
#: Characters of a decoded prompt or response ``rewardq inspect`` shows.
INSPECT_PREVIEW_CHARS = 200
#: Dead letters ``rewardq dead-letters list`` shows.
DEAD_LETTERS_LISTED = 50
#: Namespaces an error about an unknown ``--namespace`` lists (closest to the typed name first),
#: the most its SCAN collects to rank, and the seconds that SCAN may take.
NAMESPACES_LISTED = 20
NAMESPACES_SCANNED = 5000
NAMESPACE_SCAN_BUDGET = 1.0
#: ``rewardq demo``: worker processes, trajectories, and seconds its workers may take to start.
DEMO_WORKERS = 2
DEMO_TRAJECTORIES = 200
DEMO_READY_TIMEOUT = 120.0
#: Lines of a failed demo worker's log that ``rewardq demo`` prints.
DEMO_LOG_TAIL_LINES = 15
#: Trajectories ``rewardq generate`` writes.
GENERATE_TRAJECTORIES = 100

# -- managers (verl's defaults where verl has the option) ---------------------------------------
#: ``rate_limited``: requests in flight across the fleet, tokens assumed per request (verl's
#: ``estimated_tokens_per_request``) and seconds one call may take (verl's ``timeout``).
RATE_LIMITED_MAX_CONCURRENT = 1
RATE_LIMITED_TOKENS_PER_REQUEST = 2000
RATE_LIMITED_TIMEOUT = 300.0
#: Fleet-wide rate limiter: seconds a concurrency slot is held without renewal (a dead worker's
#: slot frees itself), the share of a wait drawn at random, and the longest single poll (seconds).
RATE_LIMIT_LEASE_SECONDS = 30.0
RATE_LIMIT_JITTER = 0.1
RATE_LIMIT_MAX_POLL = 0.5
#: Deepest debt of a rate-limit token bucket, in seconds of its rate: whatever one request is
#: charged (an oversize request, a judge reporting absurd usage), the fleet waits at most this
#: long for the bucket to refill, and its Redis key lives at most this long plus a minute.
RATE_LIMIT_MAX_DEBT_SECONDS = 60.0
#: ``remote``: scorer processes in its pool (and in any scorer pool built without a count), and
#: seconds one call may take.
REMOTE_NUM_WORKERS = 2
REMOTE_TIMEOUT = 30.0
#: Seconds between SIGTERM and SIGKILL for a scorer process that must stop.
KILL_GRACE = 1.0
#: Seconds a new scorer process may take to load its function before its start counts as failed.
SCORER_START_TIMEOUT = 120.0
#: ``disrm``: seconds per request.
DISRM_TIMEOUT = 30.0

#: Seconds the verl adapter waits for one trajectory's rewards (``REWARDQ_VERL_TIMEOUT``); past it
#: the trajectory scores as an error (or raises, with ``REWARDQ_VERL_ON_ERROR=raise``).
VERL_TIMEOUT = 900.0
#: What the verl adapter does with a trajectory that got no reward: ``mask`` leaves it out of
#: training (no gradient, no part in its group's baseline; rewardq.integrations.verl_mask);
#: ``zero`` scores it 0.0 with the reason in ``reward_error``; ``raise`` stops the run.
VERL_ON_ERROR = "mask"
#: The verl adapter's and hook's failure budget, counted once per run in Redis across every adapter
#: and hook process: a failure that leaves more than this share of errors among the run's last
#: ``VERL_ERROR_WINDOW`` trajectories stops the run (never before the window has filled, never on a
#: scored trajectory). At a true error rate of 10 % (a flaky judge) more than 51 errors in 256 is a
#: >5-sigma event, so a healthy run goes on; a fleet that fails everything stops within 256.
VERL_MAX_ERROR_RATE = 0.2
VERL_ERROR_WINDOW = 256
#: The largest ``verl_error_window``: the window is a ring of this many fields in one Redis hash.
VERL_ERROR_WINDOW_MAX = 100_000

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
#: Local runner: tries at killing the processes left in a job's cgroup and removing it (~10 ms apart).
CODE_CGROUP_KILL_ATTEMPTS = 100
#: Local runner: jobs a worker's cgroup parent is weighted as when nobody says how many it runs.
CODE_CGROUP_JOBS = 1
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

# -- LLM judges (the genrm manager; rewardq.reward.judge, rewardq.queue.judge_cache) ------------
#: Tokens one judge answer may have (``max_tokens`` of each request).
JUDGE_MAX_TOKENS = 1024
#: Answers asked for in one judge request (``n``).
JUDGE_ANSWERS = 1
#: Judge requests in flight at once across the whole fleet.
JUDGE_MAX_CONCURRENT = 64
#: Tokens the fleet's token bucket must hold before a judge request goes (the request is then
#: charged what the server reports in ``usage``).
JUDGE_ESTIMATED_TOKENS = 2000
#: Seconds a dead worker's claim on a judge request (and its concurrency slot) holds others back.
JUDGE_LEASE_SECONDS = 30.0
#: Longest pause, in seconds, between two looks at a judge request another worker is sending.
JUDGE_MAX_POLL = 0.5
#: Seconds one judge HTTP request may take.
JUDGE_TIMEOUT = 120.0
#: Largest judge answer read, in bytes (the HTTP body: every choice, its usage, any logprobs); a
#: larger one is an error result, and the worker never holds more of it than this.
JUDGE_MAX_ANSWER_BYTES = 4 * 1024 * 1024

# -- the fleet on Ray and the live view (rewardq.integrations.ray, rewardq top) -----------------
#: Workers ``start_fleet`` starts when told no number.
FLEET_WORKERS = 16
#: CPUs Ray reserves for each worker actor (a worker is one scoring process plus its scorers).
FLEET_NUM_CPUS = 1.0
#: Seconds ``start_fleet`` waits for its workers to report in before it raises.
FLEET_START_TIMEOUT = 300.0
#: Autoscaling: the fewest and the most workers it keeps.
AUTOSCALE_MIN_WORKERS = 1
AUTOSCALE_MAX_WORKERS = 16
#: Autoscaling: seconds the backlog should take to drain at the fleet's measured rate.
AUTOSCALE_TARGET_DRAIN_S = 60.0
#: Autoscaling: seconds between two decisions.
AUTOSCALE_INTERVAL_S = 10.0
#: Autoscaling: seconds fewer workers must be wanted before one is removed.
AUTOSCALE_SCALE_DOWN_AFTER_S = 60.0
#: Seconds of scoring time per data source a heartbeat summarises, and how many sources it keeps.
SOURCES_WINDOW_S = 60.0
SOURCES_LIMIT = 20
#: ``rewardq top``: seconds between refreshes, minutes its sparklines cover, the slowest data
#: sources it lists, and the width it renders at when the output is no terminal.
TOP_INTERVAL = 1.0
TOP_HISTORY_MINUTES = 5.0
TOP_SLOWEST_SOURCES = 5
PIPE_WIDTH = 80
#: Seconds of finished trajectories ``rewardq top`` reads back when it starts, and the most done
#: entries it reads per shard in one refresh.
DONE_FEED_SINCE_S = 300.0
DONE_FEED_READ_LIMIT = 20_000
