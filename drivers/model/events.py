"""The one vocabulary: every fact rampwatch shows is one of these events.

Each event carries `t`, seconds since the run started on a monotonic clock,
stamped where the fact happened (for tokens: when their bytes were read).
Events are msgspec Structs tagged by class name so a recording is one
JSON object per line and decodes back into the same types.
"""

from __future__ import annotations

from itertools import chain, repeat
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import msgspec

# 2: TokenTimes.counts (a stamp may stand for several chunks); schema 1 recordings read as before.
SCHEMA = 2

Mode = Literal["run", "watch", "demo"]
Level = Literal["info", "warn", "error"]
TurnOutcome = Literal["ok", "failed", "cancelled"]
# done: every turn ran; failed: done with failed turns; interrupted: SIGINT/SIGTERM or the user quit;
# crashed: the driver died or raised (exit 3); time-limit: --time-limit stopped new turns.
# saturated: a sweep's point stopped early because the server could not keep up (drivers/model/capacity.py).
RunStatus = Literal["done", "failed", "interrupted", "crashed", "time-limit", "saturated"]
NeedleMode = Literal["verbatim", "strict"]
SessionRole = Literal["ramp", "one-shot"]
ReasoningMode = Literal["off", "on", "auto"]
# What an endpoint does in the deployment: a replica does both; a prefill/decode split has one of each; a router
# serves no model and says how it spread the requests over its workers.
EndpointRole = Literal["prefill", "decode", "both", "router"]
ENDPOINT_ROLES: tuple[str, ...] = get_args(EndpointRole)


class Endpoint(msgspec.Struct, kw_only=True):
    """One server the run talks to or scrapes: sessions are sent to `url`
    (empty: metrics only, e.g. a backend behind a router), `/metrics` is read
    from `metrics` (empty: none). Both are stored without credentials."""

    name: str
    role: EndpointRole = "both"
    url: str = ""
    metrics: str = ""


def endpoint_name(url: str) -> str:
    """An endpoint's default name: host:port of its URL."""
    u = urlsplit(url)
    host = u.hostname or url
    port = u.port or (443 if u.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class PromptShape(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How a run's prompts are made beyond salted pseudo-words: the lead every session shares
    (--system-prompt, --shared-prefix), the text new turns are read from (--corpus) and the user's
    pauses (--think-time)."""

    system_prompt_chars: int = 0
    system_prompt_sha256: str = ""
    system_prompt: str | None = None  # the text itself, only with --record-text
    shared_prefix_tokens: int = 0  # the shared block's size asked for
    shared_prefix_measured: int | None = None  # its size as the server's /tokenize counts it
    lead_tokens: int = 0  # what the system message and the shared block add to every session's turn 1
    corpus: str = ""  # the --corpus path ("": pseudo-words)
    corpus_files: int = 0
    corpus_chars: int = 0
    corpus_sha256: str = ""
    think_time_s: tuple[float, float] | None = None  # a pause drawn uniformly from this range before each later turn


class TraceRun(msgspec.Struct, kw_only=True):
    """--trace as the run read it: which file and format, its block size, the slice taken, what was skipped."""

    path: str
    format: str
    block_size: int
    kv_tokens: int | None = None  # --trace-kv-tokens: the LRU pool the ideal was also computed for
    start_s: float = 0.0
    duration_s: float | None = None
    sessions: int | None = None
    max_context: int | None = None
    skipped: dict[str, int] = {}  # requests left out, by reason (bad rows with --trace-skip-bad, the slice)
    api: str = "completions"  # --trace-api: raw prompts to /v1/completions, or one chat message each
    exact: bool = True  # the prompts' blocks are exact in tokens (the server's /tokenize found one-token atoms)
    # --trace-timing: session (a turn after its previous reply plus the gap) or open; a recording made before the
    # flag sent every turn at its time (or after its previous reply, if later): open
    timing: str = "open"
    speed: float = 1.0  # --trace-speed: the trace's times were divided by this
    warm: bool = False  # --trace-warm: the prompts' salt was the trace's own, the same in every such run
    sessions_per_s: float | None = None  # sessions starting a second, at this speed: the rate offered


class Header(msgspec.Struct, tag="header", kw_only=True):
    """First line of a recording: what ran, against what, when."""

    schema: int = SCHEMA
    rampwatch_version: str
    command: list[str]
    mode: Mode
    server: str
    model: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    max_model_len: int | None = None
    host: str = ""
    started_at: str = ""  # ISO 8601 wall clock for t = 0
    sessions: int = 0
    output_tokens: int = 0
    salt: str = ""
    lockstep: bool = False  # turn k+1 of any session waits for turn k of every live session
    needle_mode: NeedleMode = "verbatim"  # strict: replies go back into the history with the code masked
    one_shot: bool = False  # a fresh prompt as long as the last turn is sent after the ramp
    time_limit_s: float | None = None  # no new turn starts after this
    grace_s: float = 0.0  # a turn in flight at the limit is cancelled after this (0: it finishes)
    tls_verified: bool = True  # False: --insecure, no certificate was checked
    endpoints: list[Endpoint] = []  # every server sent to or scraped (older recordings: none listed)
    extra_body: dict[str, Any] = {}  # --extra-body, merged into every chat request (key-like strings hidden)
    request_headers: dict[str, str] = {}  # --header as given ({session} etc. unfilled; credentials hidden)
    prompts: PromptShape | None = None  # None: salted pseudo-words, no shared lead, no pauses
    reasoning: ReasoningMode = "auto"  # --reasoning: the thinking switches sent (auto: none, the server's default)
    max_tokens: int | None = None  # --max-tokens: the cap on all generated (reasoning + answer); None: output_tokens
    arrivals_per_s: float | None = None  # --arrivals: open loop, conversations start at Poisson times of this rate
    seed: int | None = None  # --seed: what drew the arrival times
    max_live: int | None = None  # --max-live: conversations live at once (None: no cap)
    slo: str | None = None  # --slo as given: the bounds each turn is judged by (drivers/model/slo.py)
    warmup: str | None = None  # --warmup as given: the run's start left out of the goodput (a time or N arrivals)
    # A simulated engine run this many times faster than the engine it models (demo): times in the events are
    # wall clock, and RunState reads them as modelled (model/modelled.py). None: a real server, real time.
    time_scale: float | None = None
    spans_expected: bool = False  # --otlp: the engine's trace spans are received, each a few seconds after its turn
    trace: TraceRun | None = None  # --trace: the sessions came from this trace (None: a ramp)
    workers: int = 1  # driver processes the sessions ran on (--workers N, --cluster; shards merged with --merge)
    cluster: str | None = None  # --cluster as given (credentials hidden): the workers were Ray actors
    shard: tuple[int, int] | None = None  # --shard I/N: this recording holds shard I of N of one seeded run
    start_at: float | None = None  # --start-at, Unix seconds: when the shards of one run agreed to start
    merged_from: list[str] = []  # --merge: the shard recordings this run was read from


class Event(msgspec.Struct, tag=True, kw_only=True, omit_defaults=True):
    t: float


class SessionPlanned(Event):
    """A session's schedule of context targets, fixed before its first turn."""

    session: str
    schedule: list[int]
    salt: str
    needle_key: str = ""  # the name the needle is tied to (its value stays out of the file)
    needle_sha: str = ""  # sha256 of the needle value, to verify a regenerated conversation
    role: SessionRole = "ramp"  # one-shot: the baseline turn, a fresh prompt with an unshared salt
    endpoint: str = ""  # the name of the endpoint its turns are sent to
    arrival: float | None = None  # open loop (--arrivals): when the conversation arrived (its turn 1 is due then)
    worker: int | None = None  # --workers N, --shard: the driver worker its turns run on (None: the run's one driver)


class RequestSent(Event):
    """A turn's request left the client: prefill is in flight from here."""

    session: str
    turn: int  # 1-based
    target_tokens: int
    new_tokens_est: int  # tokens added since the previous turn's prompt (estimate)
    body_bytes: int
    attempt: int = 1
    text: str | None = None  # the new user message, only with --record-text
    request_id: str = ""  # the X-Request-Id it carried (the engine's name for it; "": older recordings)
    # Open loop: when the turn was due (turn 1: its arrival; later: the previous turn's end + the user's pause);
    # `t` - due is how late the client sent it (coordinated omission). None: closed loop, due when sent.
    due: float | None = None
    # --trace: the prompt tokens the trace's own blocks allowed a prefix cache to hold (drivers/model/trace_reuse.py):
    # with an unbounded cache, and with an LRU pool of --trace-kv-tokens (None: not a trace run, or no pool asked).
    ideal_cached: int | None = None
    ideal_cached_pool: int | None = None


class UserPause(Event):
    """--think-time: the user pauses from `t` for `seconds` (reading the reply, typing) before sending `turn`."""

    session: str
    turn: int
    seconds: float


class FirstToken(Event):
    session: str
    turn: int
    reasoning: bool = False  # the first generated text was reasoning: the answer starts later (FirstAnswer)


class FirstAnswer(Event):
    """The first chunk of the answer (content) of a turn whose first generated text was reasoning."""

    session: str
    turn: int


PiledUp = Literal["own", "machine"]  # whose hold piled a read's tokens up (TokenTimes.piled_up)


class TokenTimes(Event):
    """Arrival times of text-carrying chunks (first included), batched to keep
    the event rate low; `t` is the last arrival. Each of `times` is one read's stamp, standing for
    `counts` chunks (empty: one each): a fast stream's read carries hundreds under one stamp."""

    session: str
    turn: int
    times: list[float]
    counts: list[int] = []
    # A read of these carried several tokens under one kernel stamp that may have come over 5 ms apart while the
    # driver's loop was held (drivers/run/event_loop.py): "own" by its own work, "machine" by the machine's.
    piled_up: PiledUp | None = None

    def __post_init__(self) -> None:
        if self.counts and len(self.counts) != len(self.times):  # a corrupt line, said as one (never a short count)
            raise ValueError(f"{len(self.counts)} counts for {len(self.times)} times")

    def chunk_times(self) -> list[float]:
        """Each chunk's arrival time, in order."""
        return chunk_times(self.times, self.counts)


def chunk_times(times: list[float], counts: list[int]) -> list[float]:
    """Each chunk's arrival time, in order: `times`, each repeated as `counts` says (empty: once)."""
    return list(chain.from_iterable(map(repeat, times, counts))) if counts else times


class TurnDone(Event):
    session: str
    turn: int
    status: TurnOutcome
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int = 0
    chunks: int = 0
    needle: bool | None = None
    error: str | None = None
    reply_chars: int = 0
    text: str | None = None  # the reply, only with --record-text
    # The engine's own prefill of this request: vLLM's metrics.time_to_first_token_ms (scheduled to first token,
    # --enable-per-request-metrics) or llama.cpp's timings.prompt_ms. Recorded under its first name.
    engine_prefill_s: float | None = msgspec.field(default=None, name="server_prefill_s")
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens, where the server says
    reasoning_chunks: int = 0  # chunks that carried reasoning and no answer
    finish_reason: str | None = None  # the server's: stop, length, ...
    queued_s: float | None = None  # the engine's queue time (vLLM metrics.queue_time_ms: queued to scheduled)
    engine_decode_s: float | None = None  # the engine's first to last token (vLLM metrics.generation_time_ms)
    spec_accepted: int | None = None  # speculative decoding: draft tokens accepted (metrics.speculative_decoding)
    spec_drafted: int | None = None  # ... draft tokens proposed
    spec_steps: int | None = None  # ... verify steps (mean accepted length = 1 + accepted / steps)
    prefill_leg_s: float | None = None  # a split's front: how long its prefill server took (x-prefill-leg-ms)


class MetricsSample(Event):
    """One scrape, normalized by an engine profile. A field absent from
    `values` is unavailable on this server (never 0); `missing` says why.
    `source` is the endpoint's name (older recordings: its metrics URL).
    `role`: the endpoint's role where the sample says it (found through
    Prometheus, not listed in the header)."""

    source: str
    engine: str
    values: dict[str, float]
    missing: dict[str, str] = {}
    role: EndpointRole | None = None
    # A router's requests per worker (vllm-router's processed_requests_total{worker}), by the worker's label.
    workers: dict[str, float] = {}
    # When the scrape was sent (`t`: when its answer came): the values are the server's at some moment between.
    # None where not known (Prometheus's samples, older recordings).
    asked_t: float | None = None


class MetricsError(Event):
    """A source failed to answer; an empty `error`: a source with no samples of
    its own (a Prometheus server) answers again."""

    source: str
    error: str


class GpuReading(msgspec.Struct, kw_only=True):
    index: int
    name: str = ""
    node: str = ""  # the host it is on (dcgm-exporter's Hostname, else the URL's host; "" for local NVML)
    util: float | None = None  # percent
    mem_used: float | None = None  # bytes
    mem_total: float | None = None
    power: float | None = None  # watts
    power_limit: float | None = None
    sm_clock: float | None = None  # MHz
    temp: float | None = None  # Celsius


class GpuSample(Event):
    source: str
    gpus: list[GpuReading]


class GpuUnavailable(Event):
    source: str
    reason: str


class Mark(Event):
    note: str


class Notice(Event):
    """Something the user should see: an outage, a full disk, a retry."""

    level: Level
    message: str
    session: str | None = None
    topic: Literal["recording"] | None = None  # "recording": the file stopped (error) or resumed (info)


CLIENT_BUSY_S = 0.005  # the driver's loop running later than this makes the stamps it takes meanwhile suspect


class ClientLag(Event):
    """The driver's own event loop over the last second (drivers/run/loop_lag.py): how late a 10 ms timer
    woke, and the windows in which it came to look more than 5 ms late (on the driver's own loop, each holding
    the stamps taken at one late wake). A timestamp taken in such a window may be late by as much; the turns
    with one are marked client busy."""

    p50_ms: float
    p99_ms: float
    max_ms: float
    busy: list[tuple[float, float]] = []
    # The worst lag of the driver's own work: of a late wake, the CPU its process spent in the pass that held
    # the loop (drivers/run/event_loop.py; recordings made before it, 7a739a7: the lag less the time the loop lay
    # idle past its timer, at most the CPU since the last tick). None: not split (before, or another loop).
    own_max_ms: float | None = None
    # Per window of `busy`: True where the driver's own part of the lag passed 5 ms; False where the machine
    # (waking it late, or taking its core) made it so. Empty: not split (every window counts as the driver's).
    busy_own: list[bool] = []
    worker: int | None = None  # whose loop (--workers N, --shard): it marks that worker's sessions' turns only
    cpu_s: float | None = None  # CPU seconds the driver's process spent over the second (None: older recordings)


class WorkerStarted(Event):
    """A driver worker (--workers N, --cluster) is up and runs these sessions; its stamps are on the run's clock,
    as far as the first clock exchange could tell (WorkerClock)."""

    worker: int
    pid: int
    node: str = ""  # the host it runs on
    sessions: list[str] = []
    replaces: int | None = None  # --workers-restart: the lost worker whose sessions it picks up at their next turn


class WorkerClock(Event):
    """A worker's clock against the coordinator's, by ping-pong: the worker's run-clock reading less the
    coordinator's at the exchange's midpoint, give or take half its round trip. Per-turn durations come from one
    worker's clock and are exact; figures across workers carry this uncertainty."""

    worker: int
    offset_s: float
    uncertainty_s: float


class WorkerLost(Event):
    """A worker died (killed, out of memory, crashed): its turns in flight ended failed as `worker lost`."""

    worker: int
    reason: str
    sessions: list[str] = []  # the sessions it ran that had not finished
    turns_lost: int = 0  # its turns in flight, each recorded as failed
    resumed_on: int | None = None  # --workers-restart: the worker that picks its sessions up (None: they end)


class EngineSpan(Event):
    """One request as the engine's OTLP trace span tells it (--otlp), stamped when it arrived (after the request
    ended): the fold joins it to its turn by `request_id` (the X-Request-Id sent; vLLM's `chatcmpl-` prefix off)."""

    request_id: str
    trace_id: str = ""  # the span's trace (the turn's own, from the traceparent sent)
    queued_s: float | None = None  # gen_ai.latency.time_in_queue: queued to scheduled
    prefill_s: float | None = None  # gen_ai.latency.time_in_model_prefill: scheduled to first token
    # gen_ai.latency.time_to_first_token: the engine's own TTFT, from the request's arrival in its front end (vLLM:
    # before the chat template and the tokenizer) to the first token leaving it; None: an older recording's span.
    ttft_s: float | None = None
    decode_s: float | None = None  # gen_ai.latency.time_in_model_decode: first to last token
    e2e_s: float | None = None  # gen_ai.latency.e2e: arrival to end
    # The engine that served it, from its span's resource: service.instance.id, else service.name, else host.name
    # ("": the resource names none, or an older recording).
    backend: str = ""


class TraceReceiverError(Event):
    """--otlp answered a request 400: not an OTLP trace export, or too large (counted, the run goes on)."""

    error: str


class RunEnded(Event):
    """The run's last event; a crash says why in one line."""

    status: RunStatus
    exit_code: int
    error: str | None = None


AnyEvent = (
    SessionPlanned
    | RequestSent
    | FirstToken
    | FirstAnswer
    | TokenTimes
    | UserPause
    | TurnDone
    | MetricsSample
    | MetricsError
    | GpuSample
    | GpuUnavailable
    | Mark
    | Notice
    | ClientLag
    | EngineSpan
    | TraceReceiverError
    | WorkerStarted
    | WorkerClock
    | WorkerLost
    | RunEnded
)
