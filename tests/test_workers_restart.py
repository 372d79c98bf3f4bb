"""--workers-restart in the coordinator alone, against scripted workers (no process, no server): which sessions a
replacement goes on with, from which turn, and what is said of the rest, in the cases a real kill hits only by
chance (a replacement lost before its sessions said anything, an open loop's sessions still to come, sessions
that are not a ramp's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rampwatch.drivers.client.prompts import Lead
from rampwatch.drivers.client.ramp import Calibration, ConversationState
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.pacing import TurnGate
from rampwatch.drivers.run.workers import WorkerPool

STATE = ConversationState(
    chars_per_token=4.0, fixed_measured=None, last_prompt_tokens=2048, last_reply_tokens=16, source=[1]
)


class ScriptedWorker:
    """A worker link whose worker answers the clock exchange and then does what `script(link, message)` says."""

    def __init__(self, index: int, script: Callable[[ScriptedWorker, object], None]):
        self.index, self.script = index, script
        self.start_message: ww.WorkerStart | None = None
        self.sent: list[object] = []

    def start(self, message: ww.WorkerStart, on_line, on_exit) -> None:  # noqa: ANN001
        self.start_message, self.on_line, self.on_exit = message, on_line, on_exit
        self.say(ww.Hello(worker=message.worker, pid=1000 + message.worker, node="here"))

    def say(self, message: object) -> None:
        self.on_line(ww.encode(message))

    def send(self, message: object) -> None:
        self.sent.append(message)
        if isinstance(message, ww.Ping):
            self.say(ww.Pong(n=message.n, clock=time.perf_counter()))
        elif isinstance(message, ww.Begin):
            asyncio.get_running_loop().call_soon(self.script, self, message)

    def die(self) -> None:
        self.on_exit("killed by SIGKILL")

    def kill(self) -> None:
        pass

    def stderr_tail(self) -> str:
        return ""


def run_pool(
    script: Callable[[ScriptedWorker, object], None], arrivals: list[float] | None = None, restart: bool = True
) -> tuple[list[ev.AnyEvent], list[ScriptedWorker], TurnGate]:
    """Four sessions (schedule of 4 turns) on two scripted workers, lockstep; the events, the links in order."""
    schedule = [1024, 2048, 4096, 8192]
    cfg = RunConfig(url="http://127.0.0.1:1", schedule=schedule, lockstep=True, workers=2, workers_restart=restart)
    plan = ww.SessionPlan(salt="s", model="m", calibration=Calibration(), lead=Lead(), sessions=4)
    events: list[ev.AnyEvent] = []
    links: list[ScriptedWorker] = []
    gate = TurnGate(0 if arrivals is not None else 4, lockstep=True)

    def link(i: int) -> ScriptedWorker:
        links.append(ScriptedWorker(i, script))
        return links[-1]

    def emit(e: ev.AnyEvent, line: bytes | None = None) -> None:
        events.append(e)

    pool = WorkerPool(cfg, plan, emit, RunClock(), gate, link, 2, lambda: arrivals)
    asyncio.run(asyncio.wait_for(pool.run(), 10))
    return events, links, gate


def sent(session: str, turn: int) -> ev.RequestSent:
    return ev.RequestSent(t=1.0, session=session, turn=turn, target_tokens=1024, new_tokens_est=1024, body_bytes=1)


def finishes_its_turns_from_the_start(link: ScriptedWorker, begin: object) -> None:
    """Its sessions finish every turn they were given, and it is done."""
    start = link.start_message
    assert start is not None
    for k in start.sessions:
        link.say(ww.GateLeave(session=f"s{k}"))
    for r in start.resume:
        link.say(ww.GateLeave(session=f"s{r.session}"))
    link.say(ww.WorkerDone(failed=False))


def test_a_replacement_lost_before_its_sessions_said_anything_hands_them_on_at_the_same_turn():
    """w1 keeps s2's turn 2 and dies in turn 3 (lost); its replacement w2 dies before a word; w3 must go on with s2
    at turn 4 and s4 at turn 1, each with the history w1 kept, not from turn 1 again."""

    def script(link: ScriptedWorker, begin: object) -> None:
        if link.index == 0:
            return finishes_its_turns_from_the_start(link, begin)
        if link.start_message.worker == 1:
            added = ['{"role":"user","content":"a"}', '{"role":"assistant","content":"b"}']
            for turn in (1, 2):
                link.say(ww.TurnKept(session="s2", turn=turn, added=added, state=STATE))
                link.say(ww.GateAfter(turn=turn, session="s2"))
            link.say(sent("s2", 3))
            return link.die()
        if link.start_message.worker == 2:
            return link.die()
        return finishes_its_turns_from_the_start(link, begin)

    events, links, _ = run_pool(script)
    starts = {link.start_message.worker: link.start_message for link in links}
    assert sorted(starts) == [0, 1, 2, 3]
    for worker in (2, 3):
        resumed = {r.session: (r.turn, r.kept_turn, len(r.history)) for r in starts[worker].resume}
        assert resumed == {2: (4, 2, 4), 4: (1, 0, 0)}, (worker, resumed)
    lost = [e for e in events if isinstance(e, ev.WorkerLost)]
    assert [(e.worker, e.resumed_on) for e in lost] == [(1, 2), (2, 3)]
    (failed,) = [e for e in events if isinstance(e, ev.TurnDone)]
    assert (failed.session, failed.turn, failed.error) == ("s2", 3, "worker lost")


def test_an_open_loop_replacement_takes_the_sessions_to_come_as_arrivals_and_only_them():
    """w1 had s2 live (its turn 1 lost) and s4 still to arrive: w2 resumes s2 at turn 2 and gets s4 as an arrival,
    and s4 counts at the barrier only once it arrives."""

    def script(link: ScriptedWorker, begin: object) -> None:
        if link.index == 0:
            return finishes_its_turns_from_the_start(link, begin)
        if link.start_message.worker == 1:
            link.say(ww.GateJoin(session="s2"))
            link.say(sent("s2", 1))
            return link.die()
        return finishes_its_turns_from_the_start(link, begin)

    events, links, gate = run_pool(script, arrivals=[0.0, 0.0, 5.0, 5.0])
    (replacement,) = [link.start_message for link in links if link.start_message.worker == 2]
    assert replacement.sessions == [4]
    assert [(r.session, r.turn) for r in replacement.resume] == [(2, 2)]
    assert gate.live == 0  # every session that joined has left, s4 counted once only


def test_a_lost_worker_without_restart_says_which_sessions_to_come_do_not_start():
    def script(link: ScriptedWorker, begin: object) -> None:
        if link.index == 0:
            return finishes_its_turns_from_the_start(link, begin)
        link.say(ww.GateJoin(session="s2"))
        link.die()

    events, links, gate = run_pool(script, arrivals=[0.0, 0.0, 5.0, 5.0], restart=False)
    assert len(links) == 2 and gate.live == 0
    notices = [e.message for e in events if isinstance(e, ev.Notice)]
    assert any("sessions due to arrive on it later do not start: 1 (s4)" in m for m in notices), notices


def test_a_lost_worker_of_sessions_that_are_not_a_ramps_is_lost_cleanly():
    """A trace's sessions carry the trace's names: the coordinator ends them, never raises on them."""

    def script(link: ScriptedWorker, begin: object) -> None:
        if link.index == 0:
            return finishes_its_turns_from_the_start(link, begin)
        link.say(ww.GateJoin(session="alpha"))
        link.die()

    events, _, gate = run_pool(script, arrivals=[0.0, 0.0, 0.0, 0.0], restart=False)
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    assert lost.sessions == ["alpha"] and lost.resumed_on is None and gate.live == 0


def trace_request(session: str, turn: int):  # noqa: ANN201
    from rampwatch.drivers.model.trace import TraceRequest

    return TraceRequest(session=session, turn=turn, due_s=float(turn), input_length=64, output_length=4, hash_ids=[1])


def run_trace_pool(
    script,  # noqa: ANN001
    mute_from: int | None = None,
    events: list[ev.AnyEvent] | None = None,
) -> tuple[list[ev.AnyEvent], list[ScriptedWorker], TurnGate]:
    """Two scripted workers (and their replacements) under a trace's hand-out (WorkerSessions), the trace's second,
    fourth, sixth... sessions on worker 1; `await script(sessions, links)` plays the trace and the workers' part, and
    then the run finishes. Workers from index `mute_from` on never say Hello; `events` gathers the run's."""
    from rampwatch.drivers.client.trace_prompt import Atoms, Template
    from rampwatch.drivers.run.trace_spread import WorkerSessions

    prompts = ww.TraceStart(atoms=Atoms(words=("a",)), salt="s", block_size=64, template=Template(), chat=False)
    cfg = RunConfig(url="http://127.0.0.1:1", schedule=[64], workers=2, workers_restart=True)
    plan = ww.SessionPlan(salt="s", model="m", calibration=Calibration(), lead=Lead(), sessions=0)
    events = [] if events is None else events
    links: list[ScriptedWorker] = []
    gate = TurnGate(0)

    def link(i: int) -> ScriptedWorker:
        worker = ScriptedWorker(i, lambda link, begin: None)  # the script says what each worker does
        if mute_from is not None and len(links) >= mute_from:
            worker.say = lambda message: None  # type: ignore[method-assign]
        links.append(worker)
        return worker

    async def go() -> None:
        pool = WorkerPool(cfg, plan, lambda e, line=None: events.append(e), RunClock(), gate, link, 2)
        pool.session_names = [["zeta", "mid", "kappa"], ["alpha", "beta", "gamma", "eta"]]  # by first appearance
        sessions = pool.trace = WorkerSessions(pool, prompts)
        run = asyncio.create_task(pool.run())
        await asyncio.wait_for(pool.begun.wait(), 5)
        await script(sessions, links)
        sessions.finish()
        for w in links:
            w.on_line(ww.encode(ww.WorkerDone(failed=False)))
        await asyncio.wait_for(run, 5)

    asyncio.run(go())
    return events, links, gate


def announce(link: ScriptedWorker, session: str) -> None:
    link.say(ev.SessionPlanned(t=0.5, session=session, schedule=[64, 64, 64], salt="s"))
    link.say(ww.GateJoin(session=session))


async def replacement_ready(links: list[ScriptedWorker], index: int) -> None:
    while len(links) <= index or not any(isinstance(m, ww.TraceStart) for m in links[index].sent):
        await asyncio.sleep(0.01)


def test_a_lost_workers_trace_sessions_go_on_on_its_replacement_where_it_left_them():
    """--trace: w1 did alpha's turn 1 (keeping what it said) and lost turn 2 in flight, had beta handed to it but
    not yet announced, and alpha's turn 3, its end and a new session (gamma) came due while the replacement
    started. w2 gets the prompts' makings, then alpha resumed at turn 3 (not announced again; its last turn, the
    lost one, timed from the loss), beta and gamma from their start, and the dispatch's end once it has them."""

    async def script(sessions, links) -> None:  # noqa: ANN001
        w1 = links[1]
        sessions.start(2, trace_request("alpha", 1), 0.5, [64, 64, 64])  # the trace's 2nd and 4th: worker 1's
        sessions.turn(trace_request("alpha", 1))
        sessions.turn(trace_request("alpha", 2))
        announce(w1, "alpha")
        w1.say(sent("alpha", 1))
        w1.say(ev.TurnDone(t=1.2, session="alpha", turn=1, status="ok"))
        w1.say(ww.TraceSaid(session="alpha", said=[("user", "hi"), ("assistant", "hello")]))
        w1.say(sent("alpha", 2))
        sessions.start(4, trace_request("beta", 1), 0.5, [64])
        sessions.turn(trace_request("beta", 1))
        w1.die()
        sessions.turn(trace_request("alpha", 3))  # due while the replacement starts: held for it
        sessions.end("alpha")
        sessions.start(6, trace_request("gamma", 1), 0.5, [64])
        sessions.turn(trace_request("gamma", 1))
        sessions.end("gamma")
        await replacement_ready(links, 2)

    events, links, gate = run_trace_pool(script)
    said = [m for m in links[2].sent if not isinstance(m, ww.Ping | ww.Begin | ww.GateState)]
    (lost,) = [e for e in events if isinstance(e, ev.WorkerLost)]
    (failed,) = [e for e in events if isinstance(e, ev.TurnDone) and e.status == "failed"]
    assert (failed.session, failed.turn, failed.error) == ("alpha", 2, "worker lost")
    assert isinstance(said[0], ww.TraceStart)
    resume = said[1]
    assert isinstance(resume, ww.TraceResume) and (resume.k, resume.session, resume.origin) == (2, "alpha", 0.5)
    assert resume.previous == (2.0, failed.t)  # its lost turn 2: the next is due its gap after the loss
    assert resume.said == [("user", "hi"), ("assistant", "hello")]  # a text trace's conversation, as w1 kept it
    turns = [(type(m).__name__, session_of(m)) for m in said[2:]]
    assert turns == [
        ("TraceTurn", "alpha"), ("TraceEnd", "alpha"), ("TraceSession", "beta"), ("TraceTurn", "beta"),
        ("TraceSession", "gamma"), ("TraceTurn", "gamma"), ("TraceEnd", "gamma"), ("TraceOver", None),
    ]  # fmt: skip
    assert said[2].request.turn == 3 and said[-1] == ww.TraceOver()
    assert (lost.worker, lost.sessions, lost.resumed_on) == (1, ["alpha"], 2)
    (started,) = [e for e in events if isinstance(e, ev.WorkerStarted) and e.worker == 2]
    assert started.replaces == 1 and started.sessions == ["alpha", "beta", "gamma", "eta"]  # eta: still to come
    assert gate.live == 0  # alpha left the barrier with w1, to join it again as w2 starts it (a scripted one never)


def test_a_trace_session_lost_twice_goes_on_again_and_is_never_announced_twice():
    """alpha, announced by w1, goes on on w2, which is lost before a turn of it ends: w3 resumes it too, with
    the conversation w1 kept, never starting it over (a second SessionPlanned would reset its figures)."""

    async def script(sessions, links) -> None:  # noqa: ANN001
        sessions.start(2, trace_request("alpha", 1), 0.5, [64, 64])
        sessions.turn(trace_request("alpha", 1))
        announce(links[1], "alpha")
        links[1].say(ww.TraceSaid(session="alpha", said=[("user", "hi")]))
        links[1].die()
        await replacement_ready(links, 2)
        links[2].say(sent("alpha", 1))
        links[2].die()
        sessions.turn(trace_request("alpha", 2))
        sessions.end("alpha")
        await replacement_ready(links, 3)

    events, links, _ = run_trace_pool(script)
    for w in (2, 3):
        resume = [m for m in links[w].sent if isinstance(m, ww.TraceResume | ww.TraceSession)]
        assert [type(m) for m in resume] == [ww.TraceResume] and resume[0].said == [("user", "hi")], (w, resume)
    sent_to_w3 = [m.request.turn for m in links[3].sent if isinstance(m, ww.TraceTurn)]
    assert sent_to_w3 == [2]  # turn 1 was lost with w2
    assert [(e.worker, e.resumed_on) for e in events if isinstance(e, ev.WorkerLost)] == [(1, 2), (2, 3)]


def test_a_replacement_that_never_starts_names_what_ended_with_it():
    """w1 is lost with alpha announced; its replacement never says Hello (a Ray node gone), so alpha ends and is
    named with w2's loss, and beta, handed out while w2 started, is counted as never started, as gamma, due later."""
    import rampwatch.drivers.run.workers as pool_module

    async def script(sessions, links) -> None:  # noqa: ANN001
        sessions.start(2, trace_request("alpha", 1), 0.5, [64])
        sessions.turn(trace_request("alpha", 1))
        announce(links[1], "alpha")
        links[1].die()
        sessions.start(4, trace_request("beta", 1), 0.5, [64])
        while not any(isinstance(e, ev.WorkerLost) and e.worker == 2 for e in events):
            await asyncio.sleep(0.01)
        sessions.start(6, trace_request("gamma", 1), 0.5, [64])
        unstarted.update(sessions.unstarted)

    events: list[ev.AnyEvent] = []
    unstarted: dict[int, list[str]] = {}
    wait, pool_module.START_WAIT_S = pool_module.START_WAIT_S, 0.2
    try:
        _, links, gate = run_trace_pool(script, mute_from=2, events=events)
    finally:
        pool_module.START_WAIT_S = wait
    lost = [(e.worker, e.sessions, e.resumed_on) for e in events if isinstance(e, ev.WorkerLost)]
    assert lost == [(1, ["alpha"], 2), (2, ["alpha"], None)]
    assert unstarted == {2: ["beta", "gamma"]} and gate.live == 0


def session_of(message: object) -> str | None:
    """The session a coordinator's trace message is about (None: the whole worker's)."""
    if isinstance(message, ww.TraceSession):
        return message.first.session
    if isinstance(message, ww.TraceTurn):
        return message.request.session
    return getattr(message, "session", None)
