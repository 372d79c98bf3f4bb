"""A prefill/decode split's transferred KV, told apart from prefix-cache reuse for each turn.

The decode server counts the KV it received from the prefill server as cached in usage; its by-source
counters (drivers/telemetry/metrics.py's kv_transferred) say how much came over, server-wide. Each turn is
given its part of the counters' growth between a sample before it was sent and one after its first token;
until such a sample comes, its turn line waits here (see RunState)."""

from __future__ import annotations

from collections import deque

from rampwatch.drivers.model.endpoints import EndpointView
from rampwatch.drivers.model.turns import TurnRecord

GUARD_SAMPLES = 3  # a turn waits at most this many samples for the counters to hold its admission

Counters = tuple[float, float, float]  # (KV transferred in, prompt tokens admitted) since start, oldest sample's time


def transfer_counters(decode: list[EndpointView] | None) -> Counters | None:
    """A split's decode servers' counters; None when not split or they do not count transferred KV (outside a
    split, a connector's KV is a cache: usage's cached tokens)."""
    if not decode:
        return None
    counts = [ep.since_start() for ep in decode]
    if not all("kv_transferred" in c and "prompt_tokens" in c for c in counts):
        return None
    t = min(x.last_sample_t or 0.0 for x in decode)
    return (sum(c["kv_transferred"] for c in counts), sum(c["prompt_tokens"] for c in counts), t)


def covers(rec: TurnRecord, decode: list[EndpointView] | None) -> bool:
    """Whether every decode server was sampled after the turn's first token (it was admitted before that)."""
    mark = rec.first_t if rec.first_t is not None else rec.done_t
    return bool(decode) and mark is not None and all(x.sampled_after(mark) for x in decode or [])


class TransferLedger:
    """The split turns given their transferred KV so far, and those still waiting for a sample."""

    def __init__(self) -> None:
        # Finished turns whose decode-side counters do not yet cover their first token.
        self.awaiting: list[TurnRecord] = []
        # Recently attributed turns: (send time, first token time, KV transferred, prompt tokens), so a later
        # turn's counter window does not count their admissions again.
        self._attributed: deque[tuple[float, float, float, float]] = deque(maxlen=256)
        # What the turns were given, and their prompt tokens, all told: the counters since start must hold it.
        self._given_kv = 0.0
        self._given_prompt = 0.0
        self._waits: dict[tuple[str, int], tuple[float, int]] = {}  # a turn waiting: (last sample's time, samples)

    def attribute(self, rec: TurnRecord, decode: list[EndpointView] | None, final: bool = False) -> bool:
        """The KV transferred for `rec`: the decode servers' counters from its send to a sample after its first
        token, less what turns already attributed were admitted in that window (a decode server admits a turn
        just before its first token); the rest shared with the turns still unattributed by prompt tokens.
        False: the counters do not show the turn yet (a server may publish them a scrape after the first token
        reached the client), so a later sample is to be waited for (`final`: none will come)."""
        a, b = rec.transfer_at_sent, transfer_counters(decode)
        if a is None or b is None or not rec.prompt_tokens:
            return True  # nothing any sample could tell
        moved, admitted = b[0] - a[0], b[1] - a[1]
        # Turns admitted inside this window were attributed already: take theirs out. One sent after the sample
        # at `rec`'s send surely was; one sent before it but first answered after may have been admitted on either
        # side of that sample (an admission comes just before the first token), so it is taken out only if what
        # is left still holds `rec`'s own admission, which this window surely does.
        for sent_t, first_t, m, p in sorted(self._attributed, key=lambda x: x[0] <= a[2]):
            if first_t > a[2] and (sent_t > a[2] or admitted - p >= rec.prompt_tokens):
                moved, admitted = moved - m, admitted - p
        if admitted <= 0:
            return False
        if b[1] - self._given_prompt < rec.prompt_tokens:  # the counters since start cannot hold it yet
            if admitted < rec.prompt_tokens and not final and self._wait(rec, b[2]):
                return False  # nor can its window: a server may count an admission a scrape late
            # Its window holds it, or GUARD_SAMPLES samples went by: the counters lost growth (a restarted
            # server) or the turns count what they never saw (another server's). The count starts afresh here.
            self._given_prompt, self._given_kv = b[1] - rec.prompt_tokens, min(self._given_kv, a[0])
        self._waits.pop((rec.session, rec.turn), None)
        share = min(1.0, rec.prompt_tokens / admitted)
        mine = max(0, round(moved * share))
        # What the decode server's prefix cache cannot have held (more than the session's previous prompt and
        # reply; nothing before turn 1) came from the prefill side: a floor when turns share a scrape window.
        held = rec.prev_prompt_tokens + rec.prev_reply_tokens if rec.prev_prompt_tokens is not None else 0
        mine = max(mine, min(round(moved), rec.prompt_tokens - held))
        # Never more than the counters grew by beyond what earlier turns were given: the turns add up to the
        # server's total, whichever window a late-published admission fell in.
        mine = min(mine, max(0, round(b[0] - self._given_kv)))
        rec.kv_transferred = mine if rec.cached_tokens is None else min(mine, rec.cached_tokens)  # usage counts it
        self._given_kv += rec.kv_transferred
        self._given_prompt += rec.prompt_tokens
        self._attributed.append((rec.sent_t, rec.first_t or rec.sent_t, rec.kv_transferred, rec.prompt_tokens))
        return True

    def _wait(self, rec: TurnRecord, t: float) -> bool:
        """Whether `rec` may wait for another sample (fewer than GUARD_SAMPLES seen since it began to)."""
        key = (rec.session, rec.turn)
        last, seen = self._waits.get(key, (t, 0))
        seen += t != last or seen == 0
        self._waits[key] = (t, seen)
        return seen <= GUARD_SAMPLES

    def settle(self, decode: list[EndpointView] | None, final: bool) -> list[TurnRecord]:
        """The waiting turns the decode servers' counters now show, attributed (all of them at the run's end: one
        the counters never showed keeps no figure)."""
        ready: list[TurnRecord] = []
        waiting: list[TurnRecord] = []
        for rec in self.awaiting:
            shown = (final or covers(rec, decode)) and self.attribute(rec, decode, final)
            (ready if shown or final else waiting).append(rec)
        self.awaiting = waiting
        return ready
