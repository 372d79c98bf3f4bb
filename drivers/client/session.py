"""One conversation against the server: its turns, each emitting events."""

from __future__ import annotations

import asyncio
import random
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import msgspec

from rampwatch.drivers.client.chat import StreamError, chat_body, encode_message, stream_chat
from rampwatch.drivers.client.ramp import FIT_MAX_CHARS, Conversation
from rampwatch.drivers.client.request_ids import id_headers
from rampwatch.drivers.client.request_options import HeaderTemplate, merge_headers, request_headers
from rampwatch.drivers.client.tokenizer import ServerTokenizer, over_connection
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.turns import no_answer, reasoning_tokens
from rampwatch.drivers.net.wire import Connection, ConnectionDropped, ConnectionFailed


@dataclass(frozen=True)
class TurnOptions:
    model: str
    output_tokens: int = 128
    max_tokens: int | None = None  # --max-tokens: caps reasoning + answer (None: the request asks output_tokens)
    ignore_eos: bool = False
    retries: int = 0
    reconnect_timeout: float = 180.0
    request_timeout: float | None = 3600.0
    record_text: bool = False
    strict_needle: bool = False  # replies go back into the history with the needle's code masked
    extra_body: dict[str, Any] = field(default_factory=dict)  # --extra-body: merged into every request
    header_templates: tuple[HeaderTemplate, ...] = ()  # --header values with {session}/{turn}/{run} to fill in
    run_id: str = ""  # what {run} stands for (the run's salt)
    think_time: tuple[float, float] | None = None  # --think-time: seconds the user pauses before each later turn
    # A demo's engine runs this many times faster than the one it models; the user's pauses are modelled time too.
    time_scale: float = 1.0


MASKED_CODE = "XXXX-XXXX"  # what a strict-needle history holds where a reply repeated the code


class Gate(Protocol):
    """When the next turn may start (drivers/run/pacing.py's TurnGate)."""

    time_up: bool

    async def before(self, turn: int) -> bool: ...
    def after(self, turn: int) -> None: ...
    def leave(self) -> None: ...


class SessionRunner:
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
        self.sid, self.conv, self.client, self.headers = sid, conv, client, headers
        self.base_url = base_url.rstrip("/")
        # The streaming turns go over a connection of their own (drivers/net/wire.py); httpx does the rest.
        self.conn = Connection(self.base_url, clock, tls=tls)
        self.path = urlsplit(self.base_url).path + "/v1/chat/completions"
        self.opts, self.emit, self.clock = opts, emit, clock
        # Encoded messages, re-sent every turn; the run's system message (--system-prompt) opens them.
        system = conv.lead.system
        self.history: list[bytes] = [encode_message("system", [system])] if system is not None else []
        self.failed = False
        self.gate, self.role = gate, role
        # Open loop (--arrivals): when the conversation arrived; each turn then records when it was due.
        self.arrival: float | None = None
        self._due: float | None = None
        self._first: tuple[bytes, str | None] | None = None  # turn 1's message, built ahead by prepare()
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
            if self._first is None:
                await self._measure_fixed_text()
            for turn in range(1, len(self.conv.schedule) + 1):
                # Lockstep: the barrier first, then this session's own pause.
                if (gate is not None and not await gate.before(turn)) or not await self._user_pause(turn):
                    self.emit(
                        ev.Notice(
                            t=self.clock(),
                            level="info",
                            session=self.sid,
                            message=f"{self.sid}: time limit; stopped before turn {turn}",
                        )
                    )
                    break
                outcome = await self.run_turn(turn)
                if self._due is not None:
                    self._due = self.clock()  # the next turn is due at this one's end (+ the user's pause)
                if gate is not None:
                    gate.after(turn)
                if outcome != "ok":
                    self.failed = True
                if outcome == "gone":
                    self.emit(
                        ev.Notice(
                            t=self.clock(),
                            level="error",
                            session=self.sid,
                            message=f"{self.sid}: stopped at turn {turn}; the server did not come back",
                        )
                    )
                    return False
            return not self.failed
        finally:
            if gate is not None:
                gate.leave()
            self.conn.close()

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
        for piece in self.conv.user_message(turn, filler_chars):
            pieces.append(piece)
            await asyncio.sleep(0)  # a 1M-token turn is built without stalling other sessions
        if self.tokenizer and self.conv.fits(turn) and filler_chars <= FIT_MAX_CHARS:
            # The server counts the turn before it goes: turn 1 as the whole prompt, a later one as its text.
            text = "".join(pieces)
            tokens = await (
                self.tokenizer.prompt(text, self.conv.lead.system) if turn == 1 else self.tokenizer.text(text)
            )
            if tokens:
                pieces = self.conv.fit_turn(turn, pieces, tokens)
        return encode_message("user", pieces), "".join(pieces) if self.opts.record_text else None

    async def run_turn(self, turn: int) -> str:
        """'ok', 'failed' (after retries), or 'gone' (the server did not come back)."""
        _, new_est = self.conv.plan(turn)
        if turn == 1 and self._first is not None:
            (user, user_text), self._first = self._first, None
        else:
            user, user_text = await self._user_message(turn)
        o = self.opts
        body = chat_body(o.model, [*self.history, user], o.max_tokens or o.output_tokens, o.ignore_eos, o.extra_body)
        headers = merge_headers(self.headers, request_headers(list(o.header_templates), self.sid, turn, o.run_id))
        target = self.conv.schedule[turn - 1]
        attempt = 0
        while True:
            attempt += 1
            # Each attempt names itself to the engine, so the engine's own record can be joined to it.
            ids, rid = id_headers(headers, o.run_id or self.conv.salt, self.sid, turn, attempt)
            self.emit(
                ev.RequestSent(
                    t=self.clock(),
                    session=self.sid,
                    turn=turn,
                    target_tokens=target,
                    new_tokens_est=new_est,
                    body_bytes=sum(map(len, body)),
                    attempt=attempt,
                    text=user_text,
                    request_id=rid,
                    due=self._due,
                )
            )
            try:
                res = await stream_chat(
                    self.conn,
                    self.path,
                    body,
                    {**headers, **ids},
                    self._on_first(turn),
                    self._on_times(turn),
                    self.opts.request_timeout,
                    on_reasoning=self._on_first(turn, reasoning=True),
                    on_answer=self._on_answer(turn),
                )
            except asyncio.CancelledError:
                self.emit(
                    ev.TurnDone(t=self.clock(), session=self.sid, turn=turn, status="cancelled", error="cancelled")
                )
                raise
            except (
                TimeoutError,
                StreamError,
                ConnectionFailed,
                ConnectionDropped,
                msgspec.DecodeError,
                UnicodeDecodeError,
                ValueError,
            ) as e:
                reason = _describe(e)
                self.emit(ev.TurnDone(t=self.clock(), session=self.sid, turn=turn, status="failed", error=reason))
                if isinstance(e, (ConnectionFailed, ConnectionDropped)):
                    back = await self._await_server()
                    if back is True:
                        attempt -= 1  # an outage does not use up a retry
                        continue
                    if back is None:
                        return "gone"
                if attempt <= self.opts.retries:
                    self.emit(
                        ev.Notice(
                            t=self.clock(),
                            level="warn",
                            session=self.sid,
                            message=f"{self.sid} turn {turn}: retry {attempt}/{self.opts.retries} after: {reason}",
                        )
                    )
                    await asyncio.sleep(min(30.0, 2.0**attempt))
                    continue
                return "failed"
            completion = res.completion_tokens if res.completion_tokens is not None else res.chunks
            # Cut before any answer: the needle was not answered (None), which is not a wrong answer.
            needle = None if no_answer(res.finish_reason, len(res.text)) else self.conv.needle.found_in(res.text)
            reasoning = reasoning_tokens(res.reasoning_tokens, res.reasoning_chunks, completion, res.chunks)
            self.emit(
                ev.TurnDone(
                    t=self.clock(),
                    session=self.sid,
                    turn=turn,
                    status="ok",
                    prompt_tokens=res.prompt_tokens,
                    cached_tokens=res.cached_tokens if res.cached_tokens is not None else res.server_cached,
                    completion_tokens=completion,
                    chunks=res.chunks,
                    needle=needle,
                    reply_chars=len(res.text),
                    text=res.text if self.opts.record_text else None,
                    engine_prefill_s=res.engine_prefill_s,
                    reasoning_tokens=res.reasoning_tokens,
                    reasoning_chunks=res.reasoning_chunks,
                    finish_reason=res.finish_reason,
                    queued_s=res.queued_s,
                    engine_decode_s=res.engine_decode_s,
                    spec_accepted=res.spec.num_accepted_draft_tokens if res.spec else None,
                    spec_drafted=res.spec.num_draft_tokens if res.spec else None,
                    spec_steps=res.spec.num_spec_steps if res.spec else None,
                    prefill_leg_s=res.prefill_leg_s,
                )
            )
            # The next turn re-sends the answer alone (never the reasoning), as chat clients do, and no more of it
            # than --output-tokens: with --max-tokens the server may answer longer than the ramp plans for.
            answer, answer_tokens = resent_answer(res.answer_pieces, max(0, completion - reasoning), o.output_tokens)
            kept = self._kept_reply(answer)
            self.conv.add_reply(res.prompt_tokens, answer_tokens, await self._resent_tokens(kept))
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

    async def _await_server(self) -> bool | None:
        """After a dropped connection: wait for /health to answer again, up to
        --reconnect-timeout. True: back after an outage; False: it never left
        (an ordinary failed turn); None: still gone."""
        start = self.clock()
        try:
            r = await self.client.get(self.base_url + "/health", headers=self.headers, timeout=5.0)
            if r.status_code == 200:
                return False
        except httpx.HTTPError:
            pass
        if self.opts.reconnect_timeout <= 0:
            return None
        self.emit(
            ev.Notice(
                t=start,
                level="warn",
                session=self.sid,
                message=f"{self.sid}: server unreachable, waiting up to {self.opts.reconnect_timeout:.0f}s",
            )
        )
        while self.clock() - start < self.opts.reconnect_timeout:
            await asyncio.sleep(2.0)
            try:
                r = await self.client.get(self.base_url + "/health", headers=self.headers, timeout=5.0)
                if r.status_code == 200:
                    self.emit(
                        ev.Notice(
                            t=self.clock(),
                            level="info",
                            session=self.sid,
                            message=f"{self.sid}: server back after {self.clock() - start:.0f}s outage",
                        )
                    )
                    return True
            except httpx.HTTPError:
                pass
        self.emit(
            ev.Notice(
                t=self.clock(),
                level="error",
                session=self.sid,
                message=f"{self.sid}: server still gone after {self.opts.reconnect_timeout:.0f}s",
            )
        )
        return None

    def _on_first(self, turn: int, reasoning: bool = False) -> Callable[[float], None]:
        return lambda t: self.emit(ev.FirstToken(t=t, session=self.sid, turn=turn, reasoning=reasoning))

    def _on_answer(self, turn: int) -> Callable[[float], None]:
        return lambda t: self.emit(ev.FirstAnswer(t=t, session=self.sid, turn=turn))

    def _on_times(self, turn: int) -> Callable[[list[float]], None]:
        return lambda times: self.emit(ev.TokenTimes(t=times[-1], session=self.sid, turn=turn, times=times))


def resent_answer(pieces: list[str], tokens: int, budget: int) -> tuple[str, int]:
    """(the answer as the history keeps it, the tokens that stand for it without /tokenize): the answer whole when
    its `tokens` (usage's completion less reasoning) are within `budget` (--output-tokens), else cut at the chunk
    where its budget-th token lies, its tokens taken as spread evenly over its chunks (one a chunk, except under
    speculative decoding)."""
    if tokens <= budget or not pieces:
        return "".join(pieces), tokens
    kept = max(1, round(budget * len(pieces) / tokens))
    return "".join(pieces[:kept]), budget


def _describe(e: Exception) -> str:
    if isinstance(e, StreamError):
        return str(e)
    if isinstance(e, ConnectionFailed):
        return "cannot connect to the server"
    if isinstance(e, ConnectionDropped):
        return "connection dropped mid-stream"
    if isinstance(e, asyncio.TimeoutError):
        return "request timed out (--request-timeout)"
    if isinstance(e, msgspec.DecodeError):
        return f"malformed stream chunk: {e}"
    return f"{type(e).__name__}: {e}"
