"""One growing conversation against the server: each turn re-sends the history with new text, planted with the
needle and budgeted to its target, and keeps the reply; what each turn does on the wire is streamer.py's."""

from __future__ import annotations

import asyncio
import random
import re
import ssl
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from rampwatch.drivers.client.chat import chat_body, encode_message
from rampwatch.drivers.client.ramp import FIT_MAX_CHARS, Conversation, ConversationState
from rampwatch.drivers.client.streamer import Outcome, TurnOptions, TurnPlan, TurnStreamer
from rampwatch.drivers.client.tokenizer import ServerTokenizer, over_connection
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.net.pass_share import take_turn

MASKED_CODE = "XXXX-XXXX"  # what a strict-needle history holds where a reply repeated the code


class Gate(Protocol):
    """When the next turn may start (drivers/run/pacing.py's TurnGate)."""

    time_up: bool

    async def before(self, turn: int) -> bool: ...
    def after(self, turn: int) -> None: ...
    def leave(self) -> None: ...


class SessionRunner(TurnStreamer):
    """One session's conversation, turn after turn: builds each request, streams
    it over the session's own connection, and emits what it saw as events."""

    def __init__(
        self,
        sid: str,
        conv: Conversation,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        opts: TurnOptions,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        gate: Gate | None = None,
        role: ev.SessionRole = "ramp",
        tls: ssl.SSLContext | None = None,
    ):
        super().__init__(sid, client, base_url, headers, opts, emit, clock, conv.salt, tls)
        self.conv = conv
        # Encoded messages, re-sent every turn; the run's system message (--system-prompt) opens them.
        system = conv.lead.system
        self.history: list[bytes] = [encode_message("system", [system])] if system is not None else []
        self.failed = False
        self.gate, self.role = gate, role
        # Open loop (--arrivals): when the conversation arrived; each turn then records when it was due.
        self.arrival: float | None = None
        self._due: float | None = None
        self._first: tuple[bytes, str | None] | None = None  # turn 1's message, built ahead by prepare()
        self.first_turn = 1  # a session picked up from a lost worker (resume) goes on from a later one
        self._think = random.Random(f"{conv.salt}-think")  # the user's pauses: drawn the same for the same salt
        # The server's own counts, where calibration found a /tokenize (None: usage alone corrects the budget).
        self.tokenizer = (
            ServerTokenizer(
                over_connection(self.conn, urlsplit(self.base_url).path, headers),
                opts.model,
                conv.tokenize_field,
                conv.special_tokens,
            )
            if conv.tokenize_field
            else None
        )

    def plan_event(self) -> ev.SessionPlanned:
        c = self.conv
        return ev.SessionPlanned(
            t=self.clock(),
            session=self.sid,
            schedule=c.schedule,
            salt=c.salt,
            needle_key=c.needle.key,
            needle_sha=c.needle.sha256,
            role=self.role,
            endpoint=ev.endpoint_name(self.base_url),
            arrival=self.arrival,
        )

    async def run(self) -> bool:
        """All turns in order. A turn that fails after its retries is recorded
        and the ramp goes on to the next turn; a server gone for longer than
        --reconnect-timeout ends the session."""
        gate = self.gate
        self._due = self.arrival  # turn 1 is due when the conversation arrived
        try:
            if self._first is None and self.first_turn == 1:
                await self._measure_fixed_text()
            for turn in range(self.first_turn, len(self.conv.schedule) + 1):
                # Lockstep: the barrier first, then this session's own pause.
                if (gate is not None and not await gate.before(turn)) or not await self._user_pause(turn):
                    self.notice("info", f"{self.sid}: time limit; stopped before turn {turn}")
                    break
                outcome = await self.run_turn(turn)
                if self._due is not None:  # the next turn is due at this one's end (+ the user's pause)
                    self._due = self.last_end()
                if gate is not None:
                    gate.after(turn)
                if outcome != "ok":
                    self.failed = True
                if outcome == "gone":
                    self.notice("error", f"{self.sid}: stopped at turn {turn}; the server did not come back")
                    return False
            return not self.failed
        finally:
            if gate is not None:
                gate.leave()
            self.conn.close()

    def resume(self, turn: int, history: list[bytes], state: ConversationState | None, kept_turn: int) -> None:
        """Go on at `turn` from where another process left this session (--workers-restart): its history and
        what its conversation had learnt after turn `kept_turn` (None, 0: none kept). The turns between drew
        their text there (one lost in flight, one that ended as its process died): it is drawn again and
        dropped, so the next turn's text is new, not the lost one's the server may have cached."""
        self.first_turn, self.history = turn, history
        if state is not None:
            self.conv.resume(state)
        for skipped in range(kept_turn + 1, turn):
            self.conv.skip(skipped)

    async def prepare(self) -> None:
        """Ahead of the conversation's arrival (open loop): count the fixed text and build turn 1's message, so
        turn 1 leaves when it is due, not after the client's own round trips to /tokenize."""
        await self._measure_fixed_text()
        self._first = await self._user_message(1)

    def close(self) -> None:
        """Close the streaming connection (a prepared conversation that never arrived: run() closes its own)."""
        self.conn.close()

    async def _user_pause(self, turn: int) -> bool:
        """--think-time: the user reads the reply and types the next message before every turn after the
        first. False: the time limit came meanwhile. The pause is drawn in modelled seconds and slept and
        recorded in wall seconds, like every time of a sped-up run (the fold multiplies it back)."""
        span = self.opts.think_time
        if span is None or turn == 1:
            return True
        seconds = self._think.uniform(*span) / self.opts.time_scale
        if self._due is not None:
            self._due += seconds
        self.emit(ev.UserPause(t=self.clock(), session=self.sid, turn=turn, seconds=seconds))
        await asyncio.sleep(seconds)
        return self.gate is None or not self.gate.time_up

    async def _user_message(self, turn: int) -> tuple[bytes, str | None]:
        filler_chars, _ = self.conv.plan(turn)
        pieces = []
        await take_turn()
        for piece in self.conv.user_message(turn, filler_chars):
            pieces.append(piece)
            await take_turn()  # a 1M-token turn, or 256 sessions' turns at once, built without stalling the loop
        if self.tokenizer and self.conv.fits(turn) and filler_chars <= FIT_MAX_CHARS:
            # The server counts the turn before it goes: turn 1 as the whole prompt, a later one as its text.
            for _ in range(self.conv.fit_rounds()):
                text = "".join(pieces)
                tokens = await (
                    self.tokenizer.prompt(text, self.conv.lead.system) if turn == 1 else self.tokenizer.text(text)
                )
                if not tokens or tokens == self.conv.fit_goal(turn):
                    break
                pieces = self.conv.fit_turn(turn, pieces, tokens)
        return encode_message("user", pieces), "".join(pieces) if self.opts.record_text else None

    async def run_turn(self, turn: int) -> Outcome:
        """'ok', 'failed' (after retries), or 'gone' (the server did not come back)."""
        _, new_est = self.conv.plan(turn)
        if turn == 1 and self._first is not None:
            (user, user_text), self._first = self._first, None
        else:
            user, user_text = await self._user_message(turn)
        o = self.opts
        body = chat_body(o.model, [*self.history, user], o.max_tokens or o.output_tokens, o.ignore_eos, o.extra_body)
        plan = TurnPlan(target=self.conv.schedule[turn - 1], new_tokens_est=new_est, text=user_text, due=self._due)
        outcome, res = await self.send(turn, body, plan, lambda r: self.conv.needle.found_in(r.text))
        if res is None:
            return outcome
        await take_turn()  # every session's stream may end in one engine step: each takes its reply in turn
        completion, reasoning = self.completion_and_reasoning(res)
        # The next turn re-sends the answer alone (never the reasoning), as chat clients do, and no more of it
        # than --output-tokens: with --max-tokens the server may answer longer than the ramp plans for.
        answer, answer_tokens = resent_answer(res.answer_pieces, max(0, completion - reasoning), o.output_tokens)
        kept = self._kept_reply(answer)
        # The last turn's reply is never re-sent: no round trip to count it (a long reply's /tokenize is the
        # server's work too).
        last = turn == len(self.conv.schedule)
        self.conv.add_reply(res.prompt_tokens, answer_tokens, None if last else await self._resent_tokens(kept))
        self.history += [user, encode_message("assistant", [kept])]
        return "ok"

    async def _resent_tokens(self, reply: str) -> int | None:
        """The reply's tokens as the next turn will re-send it (None without /tokenize:
        the answer's completion tokens then stand in)."""
        return await self.tokenizer.text(reply) if reply and self.tokenizer else None

    async def _measure_fixed_text(self) -> None:
        if self.tokenizer:
            counts = [await self.tokenizer.text(self.conv.fixed_text(turn)) for turn in (1, 2)]
            if None not in counts:
                self.conv.measured_fixed(*counts)

    def _kept_reply(self, content: str) -> str:
        """The reply as it goes back into the history: verbatim, or (strict
        needle) with the code masked, so the only copy stays in turn 1."""
        if not self.opts.strict_needle:
            return content
        return re.sub(re.escape(self.conv.needle.value), MASKED_CODE, content, flags=re.IGNORECASE)


def resent_answer(pieces: list[str], tokens: int, budget: int) -> tuple[str, int]:
    """(the answer as the history keeps it, the tokens that stand for it without /tokenize): the answer whole when
    its `tokens` (usage's completion less reasoning) are within `budget` (--output-tokens), else cut at the chunk
    where its budget-th token lies, its tokens taken as spread evenly over its chunks (one a chunk, except under
    speculative decoding)."""
    if tokens <= budget or not pieces:
        return "".join(pieces), tokens
    kept = max(1, round(budget * len(pieces) / tokens))
    return "".join(pieces[:kept]), budget
