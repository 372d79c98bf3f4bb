"""The driver's own event loop, as its ClientLag events tell it: which turns' stamps are suspect.

Stamps and lag reports come in either order: a lag report covers the last second, and a batch of token
stamps is sent up to a quarter second after its first stamp. So the recent stamps (each batch with its turn)
and the recent late windows both wait here, and each new one is judged against the other's.
Both spans are the driver's wall clock: in a sped-up demo (the fold's times modelled, `k` times the recorded
ones) they are `k` times as long in the times this sees.
A window carries whose it was: the driver's own (its work held the loop) or the machine's (the loop lay idle
past its timer, or was held without spending the CPU: the OS, a VM's host); a turn is marked `client busy` by
either, and `client_busy_own` says whether a window of the driver's own marked it.
A read that carried several tokens under one kernel stamp, which may have come over 5 ms apart while the loop
was held, marks its own turn alone (TokenTimes.piled_up, drivers/run/event_loop.py): it needs no window.
With driver workers (--workers N) each worker's loop reports its own lag (ClientLag.worker), and its windows
mark only the turns of the sessions it runs (SessionView.worker): another worker's stamps were taken on
another loop. A report of no worker (one driver; every recording made before workers) marks every turn."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.turns import TurnRecord

SHOWN_S = 2.5  # wall s: a lag report older than this (the driver reports each second) is not "now"
KEPT_S = 3.0  # wall s: longer than a lag report's second plus a stamp batch's delay: every pair is judged
REPORT_S = 1.0  # wall s: the second each lag report covers (drivers/run/loop_lag.py), the first one's too

Window = tuple[float, float, bool]  # (start, end, the driver's own)


@dataclass
class WorkerLag:
    """One worker's loop over the run (the run's one driver: worker None): its worst lag, its CPU, its marks."""

    worker: int | None
    worst_ms: float = 0.0
    worst_own_ms: float | None = None  # None: its reports do not split the lag (not its own loop, or older)
    cpu_s: float | None = None  # CPU seconds its process spent, summed over its reports (None: not reported)
    cpu_peak: float | None = None  # the largest share of a second's wall time that it spent on the CPU
    first_t: float = 0.0  # its first and latest report, in the fold's times
    last_t: float = 0.0
    marked: int = 0  # turns it marked client busy (its windows, its reads that piled tokens up)
    marked_own: int = 0  # ... by its own work
    reported: bool = False  # a lag report of its came (a turn may be marked before: a read that piled tokens up)

    def span_s(self, k: float) -> float:
        """Wall seconds its reports cover: the first one's second and on to the latest."""
        return (self.last_t - self.first_t) / k + REPORT_S

    def cpu_share(self, k: float) -> float | None:
        """Its CPU seconds over the wall seconds its reports cover (1.0: one core busy throughout)."""
        return self.cpu_s / self.span_s(k) if self.cpu_s is not None else None


class RecentLag(NamedTuple):
    """The worst lag of the latest reports, for the header: by how much, whose loop, and whether the machine's."""

    ms: float
    worker: int | None  # the worker whose loop it was, where several report (None: one driver)
    machines: bool  # that second's late windows were all the machine waking the loop late, none its own work


class ClientCheck:
    """The latest lag report, the worst lag of the run, and the turns marked client busy."""

    def __init__(self) -> None:
        self.k = 1.0  # the fold's seconds per wall second (a sped-up demo's time scale; RunState sets it)
        self.latest: ev.ClientLag | None = None  # the latest report of any worker
        self.latest_by: dict[int | None, ev.ClientLag] = {}  # ... of each worker (None: the one driver)
        # Each worker's loop over the run, in order of its first report or mark (a read that piled tokens up may
        # mark a turn before its loop's first report; one that never reports is no loop the report lists).
        self.workers: dict[int | None, WorkerLag] = {}
        self.worst_ms: float | None = None  # None: the recording has no lag reports (made before them)
        self.worst_own_ms: float | None = None  # the worst with the machine's late wakes taken off; None: not split
        self.marked = 0  # turns marked client busy so far (a finished turn may be marked after its end)
        self.marked_own = 0  # ... of them by the driver's own work
        # The recent stamps and windows, by worker (None: the one driver's, whose windows judge every stamp).
        self._stamps: dict[int | None, deque[tuple[TurnRecord, list[float]]]] = {}
        self._windows: dict[int | None, deque[Window]] = {}

    def stamped(self, rec: TurnRecord, times: list[float], worker: int | None = None) -> None:
        """A batch of `rec`'s stamps, taken on `worker`'s loop (its session's worker; None: the one driver)."""
        stamps = self._stamps.get(worker)
        if stamps is None:
            stamps = self._stamps[worker] = deque()
        stamps.append((rec, times))
        while stamps[0][1][-1] < times[-1] - KEPT_S * self.k:
            stamps.popleft()
        for by in (worker, None) if worker is not None else (None,):  # its worker's, and no worker's (every turn's)
            for window in self._windows.get(by, ()):
                self._judge(rec, times, window, by)

    def apply(self, e: ev.ClientLag) -> None:
        """Marks the turns with a stamp taken while the loop they were stamped on ran late (their times may be
        late too): that worker's turns, or every turn for a report of no worker."""
        self.latest = self.latest_by[e.worker] = e
        self.worst_ms = max(e.max_ms, self.worst_ms or 0.0)
        if e.own_max_ms is not None:
            self.worst_own_ms = max(e.own_max_ms, self.worst_own_ms or 0.0)
        self._tally(e)
        # A report that does not split its windows (made before, or on another loop): each is the driver's.
        owns = e.busy_own if len(e.busy_own) == len(e.busy) else [True] * len(e.busy)
        fresh = [(a, b, own) for (a, b), own in zip(e.busy, owns)]
        windows = self._windows.get(e.worker)
        if windows is None:
            windows = self._windows[e.worker] = deque()
        windows.extend(fresh)
        while windows and windows[0][1] < e.t - KEPT_S * self.k:
            windows.popleft()
        if not fresh:
            return
        judged = self._stamps.values() if e.worker is None else [self._stamps.get(e.worker, ())]
        for window in fresh:
            for stamps in judged:
                for rec, times in stamps:
                    self._judge(rec, times, window, e.worker)

    def _tally(self, e: ev.ClientLag) -> None:
        """The worker's figures over the run: its worst lag, and the CPU its process spent."""
        w = self.workers.get(e.worker)
        if w is None or not w.reported:
            w = self.workers[e.worker] = w or WorkerLag(e.worker)
            w.first_t = w.last_t = e.t
            w.reported = True
            second = REPORT_S  # the first report's second began before this saw anything
        else:
            second = (e.t - w.last_t) / self.k  # wall seconds since its last report: what this one covers
        w.last_t = max(w.last_t, e.t)
        w.worst_ms = max(w.worst_ms, e.max_ms)
        if e.own_max_ms is not None:
            w.worst_own_ms = max(e.own_max_ms, w.worst_own_ms or 0.0)
        if e.cpu_s is not None:
            w.cpu_s = (w.cpu_s or 0.0) + e.cpu_s
            if second > 0:
                w.cpu_peak = max(e.cpu_s / second, w.cpu_peak or 0.0)

    @property
    def several(self) -> bool:
        """More than one worker's loop reports (--workers N): the header and the report name which."""
        return sum(1 for w in self.workers.values() if w.worker is not None and w.reported) > 1

    def recent_lag(self, now: float) -> RecentLag | None:
        """The worst lag of each worker's latest second, the worst of them, while that is recent and over the
        busy bar; None when no worker's is."""
        worst: ev.ClientLag | None = None
        for lag in self.latest_by.values():
            if now - lag.t > SHOWN_S * self.k or lag.max_ms <= 1000 * ev.CLIENT_BUSY_S:
                continue
            if worst is None or lag.max_ms > worst.max_ms:
                worst = lag
        if worst is None:
            return None
        machines = bool(worst.busy_own) and not any(worst.busy_own)
        return RecentLag(worst.max_ms, worst.worker if self.several else None, machines)

    def lag_ms(self, now: float) -> float | None:
        """The worst lag of the latest second (of the worst worker), while that is recent and over the busy bar."""
        recent = self.recent_lag(now)
        return recent.ms if recent is not None else None

    def _judge(self, rec: TurnRecord, times: list[float], window: Window, worker: int | None) -> None:
        """Marks `rec` client busy if a stamp of `times` lies in `window` (and as the driver's own, if it was),
        counted to `worker`, whose window it is."""
        a, b, own = window
        if (rec.client_busy and (rec.client_busy_own or not own)) or times[0] > b or times[-1] < a:
            return
        if any(a <= t <= b for t in times):
            self.mark(rec, own, worker)

    def mark(self, rec: TurnRecord, own: bool, worker: int | None) -> None:
        """`rec` marked client busy (and as the driver's own, if `own`), counted to `worker`'s loop: a window of
        that loop held one of its stamps, or a read of its stream piled tokens up (TokenTimes.piled_up)."""
        w = self.workers.get(worker)
        if w is None:  # marked before its loop's first lag report (a read that piled tokens up)
            w = self.workers[worker] = WorkerLag(worker)
        if not rec.client_busy:
            self.marked += 1
            w.marked += 1
        if own and not rec.client_busy_own:
            self.marked_own += 1
            w.marked_own += 1
        rec.client_busy = True
        rec.client_busy_own = rec.client_busy_own or own


class ClientWorker(msgspec.Struct):
    """The report's figures of one worker's loop (JSON `client_workers`)."""

    worker: int | None  # None: the run's one driver
    lag_max_ms: float
    lag_own_max_ms: float | None  # of its own work (None: not split)
    cpu_s: float | None  # CPU seconds its process spent over the run (None: a recording made before it was told)
    cpu_share: float | None  # ... over the wall seconds its reports cover (1.0: one core busy throughout)
    cpu_peak: float | None  # the largest share of one second
    busy_turns: int  # turns it marked client busy (its windows, its reads that piled tokens up)
    busy_own_turns: int  # ... by its own work


def client_workers(check: ClientCheck) -> list[ClientWorker] | None:
    """Each loop that reported its lag, in the order of its worker (the one driver's: worker None); None: none
    reported."""
    reported = [w for w in check.workers.values() if w.reported]
    if not reported:
        return None
    return [
        ClientWorker(
            worker=w.worker,
            lag_max_ms=w.worst_ms,
            lag_own_max_ms=w.worst_own_ms,
            cpu_s=w.cpu_s,
            cpu_share=w.cpu_share(check.k),
            cpu_peak=w.cpu_peak,
            busy_turns=w.marked,
            busy_own_turns=w.marked_own,
        )
        for w in sorted(reported, key=lambda w: -1 if w.worker is None else w.worker)
    ]
