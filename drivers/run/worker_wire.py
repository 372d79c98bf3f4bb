"""What the coordinator and its driver workers (--workers N, --cluster) say to each other, one JSON message a line.

Coordinator -> worker: WorkerStart first (the run's configuration and everything the coordinator measured while
preparing, so every worker makes the same sessions), then Ping, Begin (the run's clock origin on the worker's own
clock: its sessions start), GateState (the run-wide lockstep barrier and time limit) and Stop (cancel the turns in
flight and finish: the time limit's grace, an interrupted run).
Worker -> coordinator: the run's events, as the recording has them, and Hello, Pong, GateAfter/GateJoin/GateLeave
(its sessions at the barrier), TurnKept and TraceSaid (--workers-restart: what each turn added to a session's
history) and WorkerDone. A local worker talks over its stdin/stdout; a Ray actor over calls that carry the same lines
(drivers/run/ray_workers.py)."""

from __future__ import annotations

import msgspec

from rampwatch.drivers.client.prompts import Lead
from rampwatch.drivers.client.ramp import Calibration, ConversationState
from rampwatch.drivers.client.trace_prompt import Atoms, Template
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.trace import TraceRequest
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.pipe import dec_hook, enc_hook


class SessionPlan(msgspec.Struct, kw_only=True):
    """What every session of a run is made from: the coordinator's, the same on every worker."""

    salt: str
    model: str
    calibration: Calibration
    lead: Lead
    sessions: int  # the run's ramp sessions, all workers together


class SessionResume(msgspec.Struct, kw_only=True):
    """A session picked up from a lost worker (--workers-restart): the turn it goes on at, and its history and
    conversation as of the last turn its worker kept (TurnKept)."""

    session: int  # k, 1-based
    turn: int
    history: list[str] = []  # its encoded messages, in order
    state: ConversationState | None = None  # None: it had kept no turn
    kept_turn: int = 0  # the turn `history` and `state` are as of: the text of those after it is drawn anew


class WorkerStart(msgspec.Struct, tag="w_start", kw_only=True):
    config: RunConfig
    plan: SessionPlan
    worker: int
    workers: int  # how many there are
    sessions: list[int]  # the sessions (1-based) this worker starts from their first turn
    time_limit_at: float | None = None  # --time-limit on the run's clock: no conversation arrives after it
    resume: list[SessionResume] = []  # a replacement's sessions, each from the turn it names
    schema: int = 1  # the newest recording schema its coordinator reads (1: a coordinator from before it said)

    def __post_init__(self) -> None:
        # A worker's events are recorded as it wrote them: a coordinator that cannot read them would drop what it
        # does not know (an older one, TokenTimes.counts) and count wrong, so the worker refuses to start.
        if self.schema < ev.SCHEMA:
            raise ValueError(versions_differ(ev.SCHEMA, self.schema))


class Ping(msgspec.Struct, tag="w_ping"):
    n: int


class Begin(msgspec.Struct, tag="w_begin"):
    origin: float  # the run's t = 0 on this worker's time.perf_counter()
    arrivals: list[float] | None = None  # open loop: session k arrives at arrivals[k - 1], on the run's clock


class GateState(msgspec.Struct, tag="w_gate"):
    live: int  # sessions live over the whole run
    turn: int  # the turn whose count changed (0: none)
    finished: int  # sessions that have finished it, over the whole run
    time_up: bool = False
    release_at: float = 0.0  # on the run's clock: a session these counts let through starts then, on every worker


class Stop(msgspec.Struct, tag="w_stop"):
    """Cancel the turns in flight (each recorded cancelled) and finish."""


class Hello(msgspec.Struct, tag="w_hello"):
    worker: int
    pid: int
    node: str
    schema: int = 1  # the recording schema of the events it writes (1: a worker from before it said)


def versions_differ(written: int, read: int) -> str:
    """Why a worker and its coordinator cannot run together: one writes events the other cannot read."""
    return (
        f"the worker writes events of recording schema {written}, the coordinator reads schema {read} at most: "
        "install the same rampwatch on the coordinator and every worker's node"
    )


class Pong(msgspec.Struct, tag="w_pong"):
    n: int
    clock: float  # the worker's time.perf_counter() when it answered


class Through(msgspec.Struct, tag="w_through"):
    """Every event this worker sent before this line is stamped at most `t` (the run's clock), and none it sends
    after is stamped much earlier: the coordinator merges the workers' events in time order up to the earliest
    worker's (spread.py). Sent every THROUGH_EVERY_S; never recorded."""

    t: float


class GateAfter(msgspec.Struct, tag="w_after"):
    turn: int
    session: str = ""


class TurnKept(msgspec.Struct, tag="w_kept", kw_only=True):
    """--workers-restart: what a session's turn added to its history (the messages, in order) and its
    conversation after it; the coordinator keeps them (never recorded) to resume the session elsewhere."""

    session: str
    turn: int
    added: list[str]
    state: ConversationState


class TraceSaid(msgspec.Struct, tag="w_tsaid"):
    """--trace with --workers-restart: what a text trace's turn added to its session's conversation, (role, text)
    in order; the coordinator keeps it (never recorded) to resume the session elsewhere."""

    session: str
    said: list[tuple[str, str]]


class GateJoin(msgspec.Struct, tag="w_join"):
    session: str


class GateLeave(msgspec.Struct, tag="w_leave"):
    session: str


class WorkerDone(msgspec.Struct, tag="w_done"):
    failed: bool  # a session of its own had a failed turn


class TraceStart(msgspec.Struct, tag="w_trace", kw_only=True):
    """--trace: what its prompts are made of, as the coordinator measured them on the server (TracePrompts), sent
    once after Begin; the worker then makes its sessions' runners as their first requests come."""

    atoms: Atoms
    salt: str
    block_size: int
    template: Template
    chat: bool


class TraceSession(msgspec.Struct, tag="w_tsession", kw_only=True):
    """--trace: the session of request `first` (the trace's k-th session by first appearance) starts on this
    worker; `origin` is the trace's due 0 on the run's clock; `schedule` its prompt sizes, as its SessionPlanned
    records them. Its requests follow as TraceTurn, `first` too."""

    k: int
    origin: float
    schedule: list[int]
    first: TraceRequest


class TraceResume(msgspec.Struct, tag="w_tresume", kw_only=True):
    """--trace with --workers-restart: session `session` (the trace's k-th) goes on here, where a lost worker left
    it: planned already, so not announced again; `previous` its last turn's (due in the trace, end on the run's
    clock) for --trace-timing session, `said` a text trace's conversation so far (TraceSaid). Its requests still
    to send follow as TraceTurn."""

    k: int
    session: str
    origin: float
    previous: tuple[float, float] | None = None
    said: list[tuple[str, str]] = []


class TraceTurn(msgspec.Struct, tag="w_tturn"):
    """--trace: the session's next request, handed on shortly before it is due."""

    request: TraceRequest


class TraceEnd(msgspec.Struct, tag="w_tend"):
    """--trace: the session has no more requests (its last was handed on, or the time limit cut it off)."""

    session: str


class TraceOver(msgspec.Struct, tag="w_tover"):
    """--trace: no session will start on this worker any more: it finishes once those it has are done."""


ToWorker = (
    WorkerStart | Ping | Begin | GateState | Stop | TraceStart | TraceSession | TraceResume | TraceTurn | TraceEnd
    | TraceOver
)  # fmt: skip
FromWorker = Hello | Pong | Through | GateAfter | GateJoin | GateLeave | WorkerDone | TurnKept | TraceSaid

encode = msgspec.json.Encoder(enc_hook=enc_hook).encode
decode_to_worker = msgspec.json.Decoder(ToWorker, dec_hook=dec_hook).decode
decode_from_worker = msgspec.json.Decoder(ev.AnyEvent | FromWorker).decode
