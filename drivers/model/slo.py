"""Service-level objectives per turn (--slo ttft=90s,answer=95s,gap=1s,tpot=100ms): a turn meets the SLO when
it finished and meets every named bound. Latency is judged as the user waited it: from the turn's due time
where it has one (open loop), else from its send time. TTFT may scale with the turn's new tokens
(ttft=0.7ms/token). The fold judges each turn once (GoodputTally); everything else reads that verdict."""

from __future__ import annotations

import re
from collections import deque

import msgspec

from rampwatch.drivers.model.turns import TurnRecord, new_tokens
from rampwatch.drivers.model.workers import LOST

SLO_KEYS = ("ttft", "answer", "gap", "tpot")
_TIME = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)(ms|s|m)(/tok(?:en)?)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0}


class Slo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The bounds asked for, in seconds (None: not asked for); as recorded in the header."""

    ttft_s: float | None = None
    ttft_per_token_s: float | None = None  # ttft=0.7ms/token: the bound is this times the turn's new tokens
    answer_s: float | None = None
    gap_s: float | None = None
    tpot_s: float | None = None
    text: str = ""  # as given


def parse_slo(text: str) -> Slo:
    """'ttft=90s,gap=1s' -> Slo; ValueError with the reason for a bad one."""
    bounds: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        key, eq, value = part.partition("=")
        key, value = key.strip().lower(), value.strip().lower().replace(" ", "")
        if key not in SLO_KEYS:
            raise ValueError(f"{key or part!r} is not a bound (use {', '.join(SLO_KEYS)})")
        m = _TIME.match(value) if eq else None
        if m is None or float(m.group(1)) <= 0:
            raise ValueError(f"{key}={value}: not a time above zero (e.g. {key}=2s, 500ms)")
        if m.group(3) and key != "ttft":
            raise ValueError(f"{key}={value}: only ttft may be per token")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
        name = "ttft_per_token_s" if m.group(3) else f"{key}_s"
        if name in bounds or (key == "ttft" and ({"ttft_s", "ttft_per_token_s"} & bounds.keys())):
            raise ValueError(f"{key} given twice")
        bounds[name] = seconds
    return Slo(**bounds, text=text.strip())


def meets(slo: Slo, rec: TurnRecord) -> bool:
    """Whether a finished turn meets every named bound (a failed or unfinished turn never does); latencies as the
    user waited them (TurnRecord.user_ttft, ...: from the due time where there is one)."""
    ttft = rec.user_ttft
    if rec.status != "ok" or ttft is None:
        return False
    if slo.ttft_s is not None and ttft > slo.ttft_s:
        return False
    if slo.ttft_per_token_s is not None and ttft > slo.ttft_per_token_s * max(1, new_tokens(rec)):
        return False
    answer = rec.user_ttfa
    if slo.answer_s is not None and (answer is None or answer > slo.answer_s):
        return False
    if slo.gap_s is not None and rec.max_gap > slo.gap_s:
        return False
    tpot = rec.tpot
    return slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s


class ConversationsMet:
    """The one definition of a conversation that met the SLO, which the report, the live header and the
    Prometheus exporter all count with: a ramp conversation none of whose turns fell in --warmup, at least one of
    whose turns finished, and every one of whose finished turns met every bound (a failed or cancelled turn does
    not). A conversation the time limit cut off counts by the turns it finished, so a later miss can take one
    back out: the count is a level, not a running total. Fold each finished turn in the order they finished."""

    def __init__(self) -> None:
        self._good: set[str] = set()
        self._spoilt: set[str] = set()  # a turn missed the SLO, or fell in the warmup

    def add(self, session: str, met: bool, in_warmup: bool = False) -> bool:
        """Fold one finished turn's verdict; whether its conversation counts now."""
        if in_warmup or not met:
            self._spoilt.add(session)
            self._good.discard(session)
        elif session not in self._spoilt:
            self._good.add(session)
        return session in self._good

    def __len__(self) -> int:
        return len(self._good)

    def __contains__(self, session: object) -> bool:
        return session in self._good


GOODPUT_WINDOW_S = 300.0  # the live share of turns meeting the SLO looks back this far


class GoodputTally:
    """The SLO over the run as the fold judges it (RunState keeps one): each settled ramp turn's verdict is set on
    its record; turns judged and met past --warmup, conversations whose every turn met it, and the share met among
    the turns finished in the last GOODPUT_WINDOW_S. O(1) amortised a turn. The report, the live header and the
    exporter all read these."""

    def __init__(self, slo: Slo | None = None) -> None:
        self.slo = slo
        self.judged = 0  # turns past the warmup judged (failed ones count as not met; lost with a worker, not at all)
        self.met = 0
        self.conversations = ConversationsMet()
        self._recent: deque[tuple[float, bool]] = deque()

    def judge(self, rec: TurnRecord, t: float) -> None:
        """Set a settled ramp turn's verdict, and count it unless it fell in the warmup (rec.in_warmup)."""
        if self.slo is None or rec.error == LOST:  # lost with its driver worker: nothing said of the server
            return
        ok = rec.slo_met = meets(self.slo, rec)
        if rec.in_warmup:
            self.conversations.add(rec.session, False, in_warmup=True)  # its later turns count, it does not
            return
        self.judged += 1
        self.met += ok
        self.conversations.add(rec.session, ok)
        self._recent.append((t, ok))

    @property
    def conversations_met(self) -> int:
        """Conversations that met the SLO so far (ConversationsMet), as the report counts them."""
        return len(self.conversations)

    def window_share(self, now: float) -> float | None:
        """The share of turns finished in the last GOODPUT_WINDOW_S that met the SLO (None: none finished)."""
        recent = self._recent
        while recent and recent[0][0] < now - GOODPUT_WINDOW_S:
            recent.popleft()
        return sum(ok for _, ok in recent) / len(recent) if recent else None
