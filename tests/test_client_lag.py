"""The driver checks itself (issue 19): a turn with a stamp taken while its event loop ran more than 5 ms late
is marked client busy, exactly those turns. On the driver's own loop the loop notes its late wakes and says
whose each was; on any other, a 10 ms timer's late wakes leave the windows."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from rampwatch.drivers.client.chat import stream_chat
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.client_check import client_workers
from rampwatch.drivers.model.clock import RunClock
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.net.wire import Connection, read_stamp
from rampwatch.drivers.present.turn_table import BY_HEAD, client_mark
from rampwatch.drivers.run import event_loop
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.event_loop import LateWake
from rampwatch.drivers.run.loop_lag import BUSY_S, TICK_S, LoopLagMonitor
from rampwatch.drivers.run.runner import Run
from rampwatch.drivers.sim.profiles import make_profile
from tests import procs
from tests.simhost import ThreadedSim

pytestmark = pytest.mark.serial  # late wakes of the loop are what it measures: alone, so no other test adds them

BLOCK_S = 0.05


def test_a_late_wake_leaves_a_window_and_the_second_is_summed():
    out: list[ev.AnyEvent] = []
    m = LoopLagMonitor(out.append, time.monotonic)
    for k in range(99):
        m.tick(k * TICK_S, k * TICK_S + 0.0002)
    m.tick(1.0, 1.0 + BLOCK_S)
    m.flush(1.1)
    (lag,) = out
    assert isinstance(lag, ev.ClientLag)
    assert [(round(a, 9), round(b, 9)) for a, b in lag.busy] == [(1.0, round(1.0 + BLOCK_S + TICK_S, 9))]
    assert abs(lag.p50_ms - 0.2) < 1e-6 and abs(lag.max_ms - 1000 * BLOCK_S) < 1e-6
    assert 0.2 <= lag.p99_ms <= 1000 * BLOCK_S
    m.tick(2.0, 2.0 + BUSY_S / 2)  # late, but not late enough to matter
    m.flush(2.1)
    assert out[-1].busy == []
    m.tick(3.0, 3.02)
    m.tick(3.03, 3.05)  # due as the last window closed: the same spell of lateness
    m.tick(3.2, 3.21)
    m.flush(3.3)
    assert [(round(a, 9), round(b, 9)) for a, b in out[-1].busy] == [(3.0, 3.06), (3.2, 3.22)]


def test_the_fold_marks_exactly_the_turns_stamped_in_a_window():
    state = RunState()
    for sid in ("s1", "s2", "s3"):
        state.apply(ev.SessionPlanned(t=0.0, session=sid, schedule=[100], salt=sid))
        state.apply(ev.RequestSent(t=0.0, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.FirstToken(t=0.50, session="s1", turn=1))  # before the window
    state.apply(ev.FirstToken(t=0.52, session="s2", turn=1))
    state.apply(ev.TokenTimes(t=0.70, session="s2", turn=1, times=[0.60, 0.70]))  # 0.60 is in it
    state.apply(ev.FirstToken(t=0.58, session="s3", turn=1))
    state.apply(ev.TokenTimes(t=0.80, session="s3", turn=1, times=[0.66, 0.80]))  # straddles it, none in it
    state.apply(ev.ClientLag(t=1.0, p50_ms=0.1, p99_ms=40.0, max_ms=40.0, busy=[(0.59, 0.65)]))
    busy = {sid: s.current.client_busy for sid, s in state.sessions.items()}
    assert busy == {"s1": False, "s2": True, "s3": False}
    # A batch of stamps sent after the lag report that covers it (batches wait up to a quarter second).
    state.apply(ev.TokenTimes(t=1.1, session="s1", turn=1, times=[0.62, 1.1]))
    assert state.sessions["s1"].current.client_busy
    assert state.client.worst_ms == 40.0 and state.client.lag_ms(1.5) == 40.0 and state.client.lag_ms(9.0) is None


def test_a_read_that_piled_tokens_up_marks_its_turn_alone_and_says_whose():
    """A batch whose read held several tokens long (TokenTimes.piled_up) marks that turn with no window: as the
    driver's own ("own") or the machine's ("machine"); counted to the worker that stamped it."""
    state = RunState()
    for sid in ("s1", "s2", "s3"):
        state.apply(ev.SessionPlanned(t=0.0, session=sid, schedule=[100], salt=sid))
        state.apply(ev.RequestSent(t=0.0, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.TokenTimes(t=0.7, session="s1", turn=1, times=[0.6, 0.7, 0.7], piled_up="own"))
    state.apply(ev.TokenTimes(t=0.7, session="s2", turn=1, times=[0.6, 0.7, 0.7], piled_up="machine"))
    state.apply(ev.TokenTimes(t=0.7, session="s3", turn=1, times=[0.6, 0.7, 0.7]))
    marks = {sid: (s.current.client_busy, s.current.client_busy_own) for sid, s in state.sessions.items()}
    assert marks == {"s1": (True, True), "s2": (True, False), "s3": (False, False)}
    assert (state.client.marked, state.client.marked_own) == (2, 1)
    assert client_workers(state.client) is None  # no loop reported yet: none to list (its marks wait for it)
    state.apply(ev.ClientLag(t=1.0, p50_ms=0.1, p99_ms=1.0, max_ms=1.0, busy=[]))  # the loop's first report
    (driver,) = client_workers(state.client) or []
    assert (driver.worker, driver.busy_turns, driver.busy_own_turns, driver.cpu_peak) == (None, 2, 1, None)
    assert state.client.workers[None].first_t == 1.0


def test_the_selector_bounds_how_early_a_read_s_piled_up_tokens_came():
    """PassSelector.piled_up: the earlier tokens under one kernel stamp came after the loop last looked (this
    pass's wake, or the start of the late pass before it) and after the socket was last emptied; over 5 ms
    between that and the stamp, the read is marked, as the driver's own if the CPU of the hold says so. A read
    stamped at the wake (no kernel time, or another read's forgotten) is a late wake's window's, not marked."""
    sel = event_loop.PassSelector()
    try:
        now = time.perf_counter()
        sel.woke, sel._cpu = now, time.process_time()
        assert sel.piled_up() is None  # no kernel time told
        sel.kernel_read(now + 0.003, now - 1.0)
        assert sel.piled_up() is None  # 4 ms after the loop last looked (its wake, less 1 ms)
        sel.kernel_read(now + 0.0045, now - 1.0)
        assert sel.piled_up() is False  # 5.5 ms: over, and not the driver's CPU (none spent since the wake)
        sel.read_over()
        assert sel.piled_up() is None  # forgotten once handled
        sel._pending = LateWake(now - 0.02, now, 0.015)  # the wake came 20 ms late, 15 ms of it its own work
        sel._entered = now - 0.001
        sel.kernel_read(now + 0.001, now - 1.0)
        assert sel.piled_up() is True
        sel.kernel_read(now + 0.001, now - 0.003)  # the socket was emptied 3 ms before the wake: 4 ms
        assert sel.piled_up() is None
        sel._pending = LateWake(now - 0.004, now, 0.0)  # the machine woke it late, after an idle wait from -30 ms
        sel._entered = now - 0.03
        sel.kernel_read(now + 0.001, now - 1.0)
        assert sel.piled_up() is False
        sel.read_time()  # a read stamped at the wake: a kernel time told before is not its own
        assert sel.piled_up() is None
    finally:
        sel.close()


def _blocked_run(run_loop) -> tuple[Run, tuple[float, float]]:
    """A real ramp against the simulated engine (a thread of this process); 50 ms into session 1's second
    decode, something holds the driver's loop for 50 ms (the engine's thread goes on emitting meanwhile)."""
    with ThreadedSim(make_profile("tiny")) as sim:
        cfg = RunConfig(
            url=sim.url,
            gpu="none",
            metrics_urls=[],
            schedule=[2048, 4096, 8192],
            sessions=2,
            output_tokens=200,
            ignore_eos=True,
        )
        run = Run(cfg, record=False, keep_events=True)
        emit, blocked = run.hub.emit, []

        def block() -> None:
            start = run.clock()
            time.sleep(BLOCK_S)
            blocked.append((start, run.clock()))

        def emit_and_block(e: ev.AnyEvent) -> None:
            emit(e)
            if isinstance(e, ev.FirstToken) and (e.session, e.turn) == ("s1", 2):
                asyncio.get_running_loop().call_later(BLOCK_S, block)

        run.hub.emit = emit_and_block

        async def main() -> int:
            await run.prepare()
            return await run.drive()

        assert run_loop(main()) == 0
    ((start, end),) = blocked
    return run, (start, end)


def _stamps(events: list[ev.AnyEvent]) -> dict[tuple[str, int], list[float]]:
    stamps: dict[tuple[str, int], list[float]] = {}
    for e in events:
        if isinstance(e, ev.FirstToken):
            stamps.setdefault((e.session, e.turn), []).append(e.t)
        elif isinstance(e, ev.TokenTimes):
            stamps.setdefault((e.session, e.turn), []).extend(e.chunk_times())
    return stamps


@pytest.mark.parametrize(
    "run_loop", [pytest.param(asyncio.run, id="asyncio-loop"), pytest.param(event_loop.run, id="driver-loop")]
)
def test_a_blocked_driver_loop_marks_the_turns_it_stamped_late(run_loop):
    """On asyncio's own loop the timer's windows mark the turns: the recording has the block's window. On the
    driver's, every read carries the kernel's stamp, and the tokens that piled up through the block came in one
    read under the stamp of the last: that read marks its own turn (TokenTimes.piled_up), with no window. Either
    way the turns marked are exactly those with a stamp in a recorded window or a read that piled tokens up (on
    a loaded machine the OS, and here the simulated engine's thread holding the GIL, may add their own: they
    count too; that turns outside every window stay unmarked is
    test_the_fold_marks_exactly_the_turns_stamped_in_a_window's)."""
    run, (start, end) = _blocked_run(run_loop)
    events = run.hub.events
    windows = [w for e in events if isinstance(e, ev.ClientLag) for w in e.busy]
    piled = {(e.session, e.turn) for e in events if isinstance(e, ev.TokenTimes) and e.piled_up is not None}
    if run_loop is asyncio.run:  # the timer was due at most a tick after the block began, and woke after it ended
        assert any(a <= start + TICK_S and b >= end for a, b in windows), (start, end, windows)
    else:
        assert ("s1", 2) in piled, (start, end, piled)
    late = piled | {key for key, ts in _stamps(events).items() if any(a <= t <= b for t in ts for a, b in windows)}
    marked = {(r.session, r.turn) for r in run.state.turns if r.client_busy}
    assert ("s1", 2) in late
    assert marked == late


@pytest.mark.parametrize("tls", [False, True], ids=["http", "tls"])
def test_a_lone_token_read_late_keeps_the_kernels_arrival_time_and_marks_nothing(tls, request):
    """A server sends a token every 40 ms; 20 ms after the first, the driver's loop is held for 30 ms, through
    the second's arrival. Read at the late wake, alone, it carries the kernel's receive time (stamped_socket.py),
    within a millisecond or two of its sending, not the wake's 10 ms later, over plain HTTP and over TLS alike;
    the wake counts for the lag, but no read was stamped at it, so it leaves no window and marks nothing."""
    clock, sent, times, held = RunClock(), [], [], []
    listener = socket.create_server(("127.0.0.1", 0))
    client_tls = server_tls = None
    if tls:
        cert, key = request.getfixturevalue("self_signed")
        client_tls = ssl.create_default_context(cafile=cert)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)

    def serve() -> None:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as servers do: no small write waits an ACK
        if server_tls is not None:
            conn = server_tls.wrap_socket(conn, server_side=True)
        with conn:
            conn.recv(65536)  # the request (small: one read)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for k in range(4):
                if k:
                    time.sleep(0.04)
                sent.append(clock())
                conn.sendall(_chunked_event(b'{"choices":[{"index":0,"delta":{"content":"w%d"}}]}' % k))
            conn.sendall(_chunked_event(b"[DONE]") + b"0\r\n\r\n")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    lags: list[ev.AnyEvent] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        monitor = LoopLagMonitor(lags.append, clock)
        watch = asyncio.create_task(monitor.run())

        def first(t: float) -> None:
            loop.call_later(0.02, hold)

        def hold() -> None:
            start = clock()
            time.sleep(0.03)
            held.append((start, clock()))

        url = f"{'https' if tls else 'http'}://127.0.0.1:{listener.getsockname()[1]}"
        conn = Connection(url, clock, tls=client_tls)
        await stream_chat(
            conn,
            "/v1/chat/completions",
            b"{}",
            {},
            first,
            lambda b, c, p: times.extend(ev.chunk_times(b, c)),
            timeout=10,
        )
        conn.close()
        await asyncio.sleep(0.05)
        watch.cancel()
        monitor.flush(clock())

    event_loop.run(main())
    server.join(5)
    listener.close()
    ((start, end),) = held
    assert len(times) == 4 and start < sent[1] < end, (sent, held)
    assert abs(times[1] - sent[1]) < 0.002 and times[1] < end - 0.005, (times, sent, held)
    assert not [w for e in lags if isinstance(e, ev.ClientLag) for w in e.busy]
    assert max(e.max_ms for e in lags if isinstance(e, ev.ClientLag)) >= 25  # the hold itself is reported


_PILING_SERVER = """
import socket, sys, time
def event(data):
    e = b"data: " + data + b"\\n\\n"
    return b"%x\\r\\n%s\\r\\n" % (len(e), e)
token = lambda k: event(b'{"choices":[{"index":0,"delta":{"content":"w%d"}}]}' % k)
listener = socket.socket(fileno=int(sys.argv[1]))
conn, _ = listener.accept()
conn.recv(65536)
conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\ntransfer-encoding: chunked\\r\\n\\r\\n")
conn.sendall(token(0))
time.sleep(0.04)
conn.sendall(token(1) + token(2) + token(3))  # together, while the client's loop waits
time.sleep(0.4)  # past the first batch's flush: token 4's read sends it, and the client holds its loop 30 ms
conn.sendall(token(4))
time.sleep(0.005)
conn.sendall(token(5))
time.sleep(0.015)
conn.sendall(token(6))
time.sleep(0.1)
conn.sendall(event(b"[DONE]") + b"0\\r\\n\\r\\n")
conn.close()
"""


def test_a_read_that_piled_tokens_up_marks_its_turn_only_if_the_loop_held_them():
    """Tokens written together while the loop waits come in one read under one kernel stamp: exact for all, no
    mark. Two tokens 15 ms apart, both while the driver's own work holds the loop (30 ms of CPU), come in one
    read stamped with the second's arrival: the first's stamp is 15 ms late, and that batch says so
    (piled_up "own": the driver's), with no window for any other turn. The server is another process, which
    the loop's hold does not hold up."""
    clock, batches, lags = RunClock(), [], []
    listener = socket.create_server(("127.0.0.1", 0))
    server = procs.Popen([sys.executable, "-c", _PILING_SERVER, str(listener.fileno())], pass_fds=[listener.fileno()])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        monitor = LoopLagMonitor(lags.append, clock)
        watch = asyncio.create_task(monitor.run())

        def hold() -> None:  # the driver's own work: CPU, not a sleep
            until = time.perf_counter() + 0.03
            while time.perf_counter() < until:
                pass

        def on_times(batch: list[float], counts: list[int], piled: bool | None) -> None:
            if not batches:
                loop.call_soon(hold)  # token 4's read sent the first batch: tokens 5 and 6 come during the hold
            batches.append((ev.chunk_times(batch, counts), piled))

        conn = Connection(f"http://127.0.0.1:{listener.getsockname()[1]}", clock)
        await stream_chat(conn, "/v1/chat/completions", b"{}", {}, lambda t: None, on_times, timeout=10)
        conn.close()
        await asyncio.sleep(0.05)
        watch.cancel()
        monitor.flush(clock())

    try:
        event_loop.run(main())
    finally:
        server.kill()
        server.wait()
        listener.close()
    (together, together_piled), (held, held_piled) = batches
    assert len(together) == 5 and together[1] == together[2] == together[3] and together_piled is None, batches
    assert len(held) == 2 and held[0] == held[1] and held_piled == "own", batches
    assert not [w for e in lags if isinstance(e, ev.ClientLag) for w in e.busy]


def _chunked_event(data: bytes) -> bytes:
    event = b"data: " + data + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def test_a_sped_up_demo_keeps_its_windows_and_shows_its_lag_in_wall_seconds():
    """A demo run 10x faster than real time: the fold reads every time modelled (x10), but how long a stamp
    waits for its lag report, and how long a report is "now", are the driver's wall clock: a window reported
    0.4 s (wall) after the stamp it covers still marks it, and the lag shows for the 2.5 wall seconds after."""
    state = RunState(ev.Header(rampwatch_version="", command=[], mode="demo", server="", time_scale=10.0))
    for sid in ("s1", "s2"):
        state.apply(ev.SessionPlanned(t=0.0, session=sid, schedule=[100], salt=sid))
        state.apply(ev.RequestSent(t=0.0, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.TokenTimes(t=0.70, session="s2", turn=1, times=[0.60, 0.70]))  # 0.60 is in the window
    state.apply(ev.TokenTimes(t=1.05, session="s1", turn=1, times=[0.90, 1.05]))  # none is
    state.apply(ev.ClientLag(t=1.1, p50_ms=0.1, p99_ms=40.0, max_ms=40.0, busy=[(0.59, 0.65)]))
    assert {sid: s.current.client_busy for sid, s in state.sessions.items()} == {"s1": False, "s2": True}
    assert state.client.lag_ms(10 * 1.4) == 40.0  # 0.3 wall seconds after the report: it is "now"
    assert state.client.lag_ms(10 * 3.7) is None  # 2.6 wall seconds after: no longer


def test_a_real_servers_run_keeps_its_windows_in_seconds_as_recorded():
    """The same stream unscaled: the windows are the same wall seconds (the lag shows 2.5 s, no longer)."""
    state = RunState(ev.Header(rampwatch_version="", command=[], mode="run", server=""))
    state.apply(ev.ClientLag(t=1.1, p50_ms=0.1, p99_ms=40.0, max_ms=40.0, busy=[]))
    assert state.client.lag_ms(3.5) == 40.0 and state.client.lag_ms(3.7) is None


def test_a_late_wake_noted_by_the_driver_loop_is_the_drivers_own_by_its_cpu():
    """The DriverLoop's late wakes: each window holds exactly the stamps the wake may have put off (those
    taken at it; not those of the pass that held the loop, taken as it began, unless a read in that pass was
    handled late), and is the driver's own where its process spent more than 5 ms of CPU meanwhile."""
    out: list[ev.AnyEvent] = []
    m = LoopLagMonitor(out.append, time.monotonic)
    m.lag(0.99, 0.9902)
    m.late(LateWake(1.0, 1.0 + BLOCK_S, 0.0))  # the loop lay idle past its timer: the machine's
    m.late(LateWake(2.0, 2.0 + BLOCK_S, BLOCK_S))  # a pass of the driver's own work held it
    m.late(LateWake(3.0, 3.003, 0.003))  # late, not late enough to mark: only the worst figures count it
    m.late(LateWake(3.5, 3.5 + BLOCK_S, 0.004))  # held, but not by its CPU: the machine's (the OS took the core)
    m.late(LateWake(4.0, 4.02, 0.0))
    m.late(LateWake(4.02, 4.03, 0.008))  # straight after, the driver's own: a window of its own
    m.late(LateWake(4.5, 4.52, 0.006, from_start=True))  # a read handled 6 ms into its pass: that wake too
    m.flush(4.6)
    (lag,) = out
    assert isinstance(lag, ev.ClientLag)
    assert lag.busy_own == [False, True, False, False, True, True]
    assert [(round(a, 9), round(b, 9)) for a, b in lag.busy] == [
        (1.000001, 1.050001),
        (2.000001, 2.050001),
        (3.500001, 3.550001),
        (4.000001, 4.020001),
        (4.020001, 4.030001),
        (4.499999, 4.520001),
    ]
    assert abs(lag.own_max_ms - 1000 * BLOCK_S) < 1e-6 and abs(lag.max_ms - 1000 * BLOCK_S) < 1e-6
    state = RunState()
    for sid in ("s1", "s2", "s3"):
        state.apply(ev.SessionPlanned(t=0.0, session=sid, schedule=[100], salt=sid))
        state.apply(ev.RequestSent(t=0.0, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
    state.apply(ev.TokenTimes(t=2.0, session="s1", turn=1, times=[1.0, 2.0]))  # taken as the holding passes began
    state.apply(ev.TokenTimes(t=4.02, session="s2", turn=1, times=[4.02]))  # at the machine's late wake
    state.apply(ev.TokenTimes(t=4.5, session="s3", turn=1, times=[4.5]))  # at a wake whose pass read late
    state.apply(lag)
    s1, s2, s3 = (state.sessions[sid].current for sid in ("s1", "s2", "s3"))
    assert not s1.client_busy and (s2.client_busy, s2.client_busy_own) == (True, False) and s3.client_busy_own
    state.apply(ev.TokenTimes(t=2.05, session="s1", turn=1, times=[2.0 + BLOCK_S]))  # at the late wake
    assert s1.client_busy_own
    last = LoopLagMonitor(out.append, time.monotonic)
    last.late(LateWake(5.0, 5.0 + BLOCK_S, BLOCK_S))  # noted after the last tick: the run's end keeps it
    last.flush(5.1)
    assert out[-1].busy_own == [True] and out[-1].p50_ms == 0.0
    unsplit = LoopLagMonitor(out.append, time.monotonic)  # a loop that does not note them (not a DriverLoop)
    unsplit.tick(5.0, 5.0 + BLOCK_S)
    unsplit.flush(5.1)
    assert out[-1].busy_own == [] and out[-1].own_max_ms is None


def test_a_read_is_stamped_when_the_loop_woke_for_it_not_when_its_turn_came():
    """On the driver's own loop a read waiting behind 30 ms of other work in its pass is stamped at the pass's
    wake, and a read in a later pass at that pass's; on any other loop, with the clock as it is handled."""
    clock = RunClock()

    async def stamps() -> list[tuple[float, float, float]]:
        stamp, passes = read_stamp(clock), asyncio.get_running_loop().passes  # type: ignore[attr-defined]
        out = []
        for _ in range(2):
            woke = passes.woke - clock.origin
            time.sleep(0.03)  # the reads handled before this one in the same pass
            out.append((woke, stamp(), clock()))
            await asyncio.sleep(0.01)
        return out

    (woke, stamped, handled), (woke2, stamped2, _) = event_loop.run(stamps())
    assert stamped == woke and handled - stamped >= 0.03
    assert stamped2 == woke2 and woke2 >= handled
    assert asyncio.run(_read_stamp_of(clock)) is clock


async def _read_stamp_of(clock):
    return read_stamp(clock)


def test_reads_in_one_pass_share_its_wake_and_one_handled_late_leaves_the_wake_in_a_window():
    """Two sockets readable at the same wake: both reads carry it, though the first one's 30 ms of work holds
    the second. Bytes may have come after the wake for the second, so the loop notes that pass's own wake as
    late too, and the window holds both stamps."""
    clock = RunClock()

    async def main() -> tuple[list[float], list[event_loop.LateWake]]:
        loop = asyncio.get_running_loop()
        stamp, pairs, got = read_stamp(clock), [socket.socketpair() for _ in range(2)], []
        both = loop.create_future()

        def read(k: int) -> None:
            got.append(stamp())
            pairs[k][0].recv(16)
            loop.remove_reader(pairs[k][0])
            if k == 0:
                time.sleep(0.03)
            if len(got) == 2:
                both.set_result(None)

        for k, (r, _) in enumerate(pairs):
            r.setblocking(False)
            loop.add_reader(r, read, k)
        for _, w in pairs:
            w.send(b"x")  # both in this pass: readable at the next wake
        await both
        await asyncio.sleep(0.02)
        for r, w in pairs:
            r.close()
            w.close()
        return got, loop.take_late()  # type: ignore[attr-defined]

    stamps, late = event_loop.run(main())
    assert len(stamps) == 2 and stamps[0] == stamps[1]
    offset = -clock.origin
    covering = [w for w in late if w.window(offset)[0] <= stamps[0] <= w.window(offset)[1]]
    handled_late = [w for w in covering if w.from_start and w.end - w.start >= 0.03]
    # Any other window holding them is a late wake that ended at this pass's own (the machine's, just before).
    assert handled_late and all(w in handled_late or abs(w.end + offset - stamps[0]) < 1e-9 for w in covering), late


def test_a_turn_marked_only_by_the_machine_says_so_and_the_drivers_own_window_overrides_it():
    state = RunState()
    for sid in ("s1", "s2"):
        state.apply(ev.SessionPlanned(t=0.0, session=sid, schedule=[100], salt=sid))
        state.apply(ev.RequestSent(t=0.0, session=sid, turn=1, target_tokens=100, new_tokens_est=100, body_bytes=1))
        state.apply(ev.FirstToken(t=0.1, session=sid, turn=1))
    state.apply(ev.TokenTimes(t=0.70, session="s1", turn=1, times=[0.60, 0.70]))
    state.apply(ev.TokenTimes(t=0.90, session="s2", turn=1, times=[0.62, 0.90]))
    lag = dict(p50_ms=0.1, p99_ms=40.0, max_ms=40.0)
    state.apply(ev.ClientLag(t=1.0, **lag, busy=[(0.59, 0.65)], busy_own=[False], own_max_ms=1.0))
    s1, s2 = state.sessions["s1"].current, state.sessions["s2"].current
    assert (s1.client_busy, s1.client_busy_own, s2.client_busy, s2.client_busy_own) == (True, False, True, False)
    assert (state.client.marked, state.client.marked_own, state.client.worst_own_ms) == (2, 0, 1.0)
    revision = state.turns_revision
    state.apply(ev.ClientLag(t=2.0, **lag, busy=[(0.85, 0.95)], busy_own=[True], own_max_ms=30.0))
    assert (s2.client_busy, s2.client_busy_own, s1.client_busy_own) == (True, True, False)
    assert (state.client.marked, state.client.marked_own, state.client.worst_own_ms) == (2, 1, 30.0)
    assert state.turns_revision > revision  # a finished turn's table redraws when its mark changes
    assert [client_mark(r.client_busy, r.client_busy_own) for r in (s1, s2)] == ["os", "busy"]


def test_the_client_column_sorts_unmarked_then_the_machines_then_the_drivers_own():
    marks = [(True, True), (False, False), (True, False), (True, True), (False, False)]
    rows = [SimpleNamespace(client_busy=busy, client_busy_own=own) for busy, own in marks]  # all the column reads
    column = BY_HEAD["client"]
    assert [column.cell(r) for r in sorted(rows, key=column.sort_value)] == ["", "", "os", "busy", "busy"]


def _lag_windows_of(hold, until) -> list[tuple[float, float, bool]]:
    """Runs a DriverLoop with the lag monitor (its times time.perf_counter's) while `hold(loop)` holds it, until
    `until()` (at most 20 s) and a tick more; returns each late window: (from, to, the driver's own?)."""
    out: list[ev.AnyEvent] = []

    async def main() -> None:
        m = LoopLagMonitor(out.append, RunClock(0.0))  # the run's clock, counting from perf_counter's 0
        task = asyncio.create_task(m.run())
        stream = _WakeStampedStream(asyncio.get_running_loop())
        hold(asyncio.get_running_loop())
        deadline = time.perf_counter() + 20.0
        while not until() and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        stream.close()
        task.cancel()
        m.flush(time.perf_counter())

    event_loop.run(main())
    lags = [e for e in out if isinstance(e, ev.ClientLag)]
    assert lags and all(len(e.busy_own) == len(e.busy) and e.own_max_ms is not None for e in lags)
    return [(a, b, own) for e in lags for (a, b), own in zip(e.busy, e.busy_own)]


class _WakeStampedStream:
    """A stream whose reads are stamped at the loop's wake, as TLS's are: a byte every 2 ms from another process
    (which the OS stopping this one does not stop), so a late wake has stamps to put off, and leaves its window."""

    WRITER = (
        "import socket, sys, time\n"
        "s = socket.socket(fileno=int(sys.argv[1]))\n"
        "while True:\n    s.send(b'x')\n    time.sleep(0.002)\n"
    )

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, (self.r, w) = loop, socket.socketpair()
        self.r.setblocking(False)
        loop.add_reader(self.r, self._read)
        self.writer = procs.Popen([sys.executable, "-c", self.WRITER, str(w.fileno())], pass_fds=[w.fileno()])
        w.close()

    def _read(self) -> None:
        self.loop.passes.read_time()  # type: ignore[attr-defined]
        try:
            self.r.recv(65536)
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.writer.kill()
        self.writer.wait()
        self.loop.remove_reader(self.r)
        self.r.close()


def _overlapping(windows: list[tuple[float, float, bool]], spans: list[tuple[float, float]]) -> list[list[bool]]:
    """For each span, whether each window overlapping it was the driver's own (a loaded machine adds windows)."""
    return [[own for a, b, own in windows if a < b0 and b > a0] for a0, b0 in spans]


def test_the_driver_loop_tells_the_os_holding_it_from_its_own_work():
    """Real wakes: the OS stops this process three times for 60 ms (SIGSTOP from a child process, then
    SIGCONT), and once a callback holds the loop with 60 ms of work. The stops are the machine's (the loop lay
    idle past its timer, or spent no CPU meanwhile); the work is the driver's own."""
    script = (
        "import os, signal, sys, time\n"
        "pid = int(sys.argv[1])\n"
        "for _ in range(3):\n"
        "    time.sleep(0.3)\n"
        "    a = time.perf_counter()\n"
        "    os.kill(pid, signal.SIGSTOP)\n"
        "    try:\n"
        "        time.sleep(0.06)\n"
        "        b = time.perf_counter()\n"
        "    finally:\n"
        "        os.kill(pid, signal.SIGCONT)\n"
        "    print(a, b, flush=True)\n"
    )
    child: list[subprocess.Popen] = []

    def stop_thrice(loop: asyncio.AbstractEventLoop) -> None:
        cmd = [sys.executable, "-c", script, str(os.getpid())]
        child.append(procs.Popen(cmd, stdout=subprocess.PIPE, text=True))

    windows = _lag_windows_of(stop_thrice, lambda: child[0].poll() is not None)
    stops = [tuple(map(float, line.split())) for line in child[0].communicate(timeout=10)[0].splitlines()]
    covering = _overlapping(windows, stops)
    assert len(stops) == 3 and all(c and not any(c) for c in covering), (stops, windows)

    worked: list[tuple[float, float]] = []

    def work(seconds: float) -> None:
        start = time.perf_counter()
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
        worked.append((start, time.perf_counter()))

    windows = _lag_windows_of(lambda loop: loop.call_later(0.3, work, 0.06), lambda: bool(worked))
    assert [any(c) for c in _overlapping(windows, worked)] == [True], (worked, windows)
