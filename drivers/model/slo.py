"""Service-level objectives per turn (--slo ttft=90s,answer=95s,gap=1s,tpot=100ms): a turn meets the SLO when
it finished and meets every named bound. Latency is judged from the turn's due time where it has one (open
loop: what the user waited), else from its send time. TTFT may scale with the turn's new tokens
(ttft=0.7ms/token)."""

from __future__ import annotations

import re
from collections import deque

import msgspec

from rampwatch.drivers.model.turns import TurnRecord, TurnRow, new_tokens

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


def latency_from(rec: TurnRecord) -> float:
    """Where a turn's latency counts from: its due time (open loop), else when it was sent."""
    return rec.due_t if rec.due_t is not None else rec.sent_t


def meets(slo: Slo, rec: TurnRecord) -> bool:
    """Whether a finished turn meets every named bound (a failed or unfinished turn never does)."""
    if rec.status != "ok" or rec.first_t is None:
        return False
    start = latency_from(rec)
    ttft = rec.first_t - start
    if slo.ttft_s is not None and ttft > slo.ttft_s:
        return False
    if slo.ttft_per_token_s is not None and ttft > slo.ttft_per_token_s * max(1, new_tokens(rec)):
        return False
    if slo.answer_s is not None and (rec.answer_t is None or rec.answer_t - start > slo.answer_s):
        return False
    if slo.gap_s is not None and rec.max_gap > slo.gap_s:
        return False
    if slo.tpot_s is not None:
        tokens = rec.tokens
        if rec.last_t is not None and tokens > 1 and (rec.last_t - rec.first_t) / (tokens - 1) > slo.tpot_s:
            return False
    return True


def judge_rows(slo: Slo, rows: list[TurnRow], records: list[TurnRecord]) -> None:
    """Set each report row's verdict (slo_met) from its turn's record (rows made from records, in order)."""
    for row, rec in zip(rows, records, strict=True):
        row.slo_met = meets(slo, rec)


class Warmup(msgspec.Struct, frozen=True):
    """--warmup: the start of a run left out of the goodput; a time (`60s`) or the first N arrivals (`3`)."""

    seconds: float | None = None
    conversations: int | None = None

    def excludes(self, rec: TurnRecord) -> bool:
        """Whether a turn falls in the warmup: due (else sent) before its end, or of one of the first N
        conversations (sN with N at most the count, numbered in arrival order)."""
        if self.seconds is not None:
            return latency_from(rec) < self.seconds
        n = rec.session[1:]
        return self.conversations is not None and n.isdigit() and int(n) <= self.conversations

    def text(self) -> str:
        if self.seconds is not None:
            return f"the first {self.seconds:g}s"
        return f"the first {self.conversations} conversations"


_WARMUP_TIME = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")


def parse_warmup(text: str) -> Warmup:
    """'60s', '5m' -> a time; '3' -> the first 3 arrivals (conversations); ValueError otherwise."""
    t = text.strip().lower()
    if t.isdigit() and int(t) > 0:
        return Warmup(conversations=int(t))
    m = _WARMUP_TIME.match(t)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is neither a time (e.g. 60s, 5m) nor a number of arrivals (e.g. 3)")
    return Warmup(seconds=float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)])


def read_warmup(text: str | None) -> Warmup | None:
    """A recorded --warmup (None: none, or a hand-edited header's that no longer reads: nothing left out)."""
    try:
        return parse_warmup(text) if text else None
    except ValueError:
        return None


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


GOODPUT_WINDOW_S = 300.0  # the live share of turns meeting the SLO looks back this far


class GoodputTally:
    """The live goodput (RunState keeps one): turns judged and met since the start, conversations whose every turn
    met it, their rates per minute, and the share met among the turns finished in the last GOODPUT_WINDOW_S;
    --warmup's turns (and the conversations they are of) left out, as the report does. O(1) amortised a turn."""

    def __init__(self) -> None:
        self.slo: Slo | None = None
        self.warmup: Warmup | None = None
        self._text: tuple[str, str | None] | None = None
        self.judged = 0
        self.met = 0
        self._conversations = ConversationsMet()
        self._start: float | None = None  # where the steady window starts: the warmup's end, else the run's
        self._recent: deque[tuple[float, bool]] = deque()

    def _read(self, slo_text: str, warmup_text: str | None) -> None:
        self._text = (slo_text, warmup_text)
        try:
            self.slo = parse_slo(slo_text)
        except ValueError:
            self.slo = None  # a recording edited by hand: no verdicts, rather than a failed fold
        self.warmup = read_warmup(warmup_text)
        self._start = self.warmup.seconds if self.warmup is not None else 0.0

    def add(self, slo_text: str | None, rec: TurnRecord, t: float, warmup: str | None = None) -> None:
        """Judge a finished turn (the run's --slo and --warmup as recorded)."""
        if not slo_text:
            return
        if (slo_text, warmup) != self._text:
            self._read(slo_text, warmup)
        if self.slo is None:
            return
        if self.warmup is not None and self.warmup.excludes(rec):
            self._conversations.add(rec.session, False, in_warmup=True)  # its later turns count, it does not
            return
        if self.warmup is not None and self.warmup.conversations is not None:
            # The first N arrivals left out: the window starts at the earliest due (else sent) turn kept so far,
            # as the report's (goodput.steady), not at the first to finish.
            at = latency_from(rec)
            self._start = at if self._start is None else min(self._start, at)
        ok = meets(self.slo, rec)
        self.judged += 1
        self.met += ok
        self._conversations.add(rec.session, ok)
        self._recent.append((t, ok))

    @property
    def conversations_met(self) -> int:
        """Conversations that met the SLO so far (ConversationsMet), as the report counts them."""
        return len(self._conversations)

    def per_min(self, count: int, now: float) -> float | None:
        """`count` per minute of the steady window so far (None: none of it has passed yet)."""
        if self._start is None or now <= self._start:
            return None
        return count / ((now - self._start) / 60)

    def window_share(self, now: float) -> float | None:
        """The share of turns finished in the last GOODPUT_WINDOW_S that met the SLO (None: none finished)."""
        recent = self._recent
        while recent and recent[0][0] < now - GOODPUT_WINDOW_S:
            recent.popleft()
        return sum(ok for _, ok in recent) / len(recent) if recent else None
