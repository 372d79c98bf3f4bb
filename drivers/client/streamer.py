"""One session's requests over its own connection: a turn's request streamed, retried, waited out through an
outage, and told as events (RequestSent, FirstToken, FirstAnswer, TokenTimes, TurnDone). What each turn sends is
its session's: a growing conversation (session.py) or a trace's turns (trace_session.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import msgspec

from rampwatch.drivers.client.chat import StreamError, StreamResult, stream_chat
from rampwatch.drivers.client.request_ids import id_headers
from rampwatch.drivers.client.request_options import HeaderTemplate, merge_headers, request_headers
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.turns import no_answer, reasoning_tokens
from rampwatch.drivers.net.pass_share import take_turn
from rampwatch.drivers.net.wire import Connection, ConnectionDropped, ConnectionFailed

Outcome = Literal["ok", "failed", "gone"]  # gone: the server did not come back within --reconnect-timeout


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


@dataclass(frozen=True)
class TurnPlan:
    """What a turn's RequestSent says of it besides its body."""

    target: int  # the prompt tokens it aims at
    new_tokens_est: int
    text: str | None = None  # the new user message, with --record-text
    due: float | None = None  # open loop: when it was due
    ideal_cached: int | None = None  # --trace: the ideal reuse (unbounded; an LRU pool)
    ideal_cached_pool: int | None = None


class TurnStreamer:
    """A session's connection and what every turn of it does on the wire."""

    def __init__(
        self,
        sid: str,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        opts: TurnOptions,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        salt: str,
        tls: ssl.SSLContext | None = None,
    ):
        self.sid, self.client, self.headers, self.salt = sid, client, headers, salt
        self.base_url = base_url.rstrip("/")
        # The streaming turns go over a connection of their own (drivers/net/wire.py); httpx does the rest.
        self.conn = Connection(self.base_url, clock, tls=tls)
        self.path = urlsplit(self.base_url).path + "/v1/chat/completions"
        self.completions_path = urlsplit(self.base_url).path + "/v1/completions"
        self.opts, self.emit, self.clock = opts, emit, clock
        self.ended_t: float | None = None  # when the latest attempt's reply ended (its TurnDone), ok or failed

    async def send(
        self,
        turn: int,
        body: list[bytes],
        plan: TurnPlan,
        judge: Callable[[StreamResult], bool | None],
        path: str | None = None,
    ) -> tuple[Outcome, StreamResult | None]:
        """Stream the turn's request: ('ok', its result) or ('failed'/'gone', None), every attempt told as events.
        `judge(result)`: the needle's verdict on the reply (None: not asked); `path`: another endpoint than the
        chat completions (a trace's raw prompts go to /v1/completions)."""
        o = self.opts
        headers = merge_headers(self.headers, request_headers(list(o.header_templates), self.sid, turn, o.run_id))
        attempt = 0
        while True:
            attempt += 1
            # Sent in a pass with room (many sessions let go at once take turns); stamped after the wait.
            await take_turn()
            # Each attempt names itself to the engine, so the engine's own record can be joined to it.
            ids, rid = id_headers(headers, o.run_id or self.salt, self.sid, turn, attempt)
            self.emit(
                ev.RequestSent(
                    t=self.clock(),
                    session=self.sid,
                    turn=turn,
                    target_tokens=plan.target,
                    new_tokens_est=plan.new_tokens_est,
                    body_bytes=sum(map(len, body)),
                    attempt=attempt,
                    text=plan.text,
                    request_id=rid,
                    due=plan.due,
                    ideal_cached=plan.ideal_cached,
                    ideal_cached_pool=plan.ideal_cached_pool,
                )
            )
            try:
                res = await stream_chat(
                    self.conn,
                    path or self.path,
                    body,
                    {**headers, **ids},
                    self._on_first(turn),
                    self._on_times(turn),
                    o.request_timeout,
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
                self._ended(ev.TurnDone(t=self.clock(), session=self.sid, turn=turn, status="failed", error=reason))
                if isinstance(e, (ConnectionFailed, ConnectionDropped)):
                    back = await self._await_server()
                    if back is True:
                        attempt -= 1  # an outage does not use up a retry
                        continue
                    if back is None:
                        return "gone", None
                if attempt <= o.retries:
                    self.notice("warn", f"{self.sid} turn {turn}: retry {attempt}/{o.retries} after: {reason}")
                    await asyncio.sleep(min(30.0, 2.0**attempt))
                    continue
                return "failed", None
            self._ended(self._done(turn, res, judge))
            return "ok", res

    def last_end(self) -> float:
        """When the latest attempt's reply ended, else now: what a turn timed from the one before counts from."""
        return self.ended_t if self.ended_t is not None else self.clock()

    def _ended(self, done: ev.TurnDone) -> None:
        """An attempt's end, told; a next turn timed from this one's end counts from it, not from when the
        session has taken the reply in (a /tokenize round trip, a turn of the loop later)."""
        self.ended_t = done.t
        self.emit(done)

    def _done(self, turn: int, res: StreamResult, judge: Callable[[StreamResult], bool | None]) -> ev.TurnDone:
        completion = res.completion_tokens if res.completion_tokens is not None else res.chunks
        # Cut before any answer: the needle was not answered (None), which is not a wrong answer.
        needle = None if no_answer(res.finish_reason, len(res.text)) else judge(res)
        return ev.TurnDone(
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

    @staticmethod
    def completion_and_reasoning(res: StreamResult) -> tuple[int, int]:
        """(generated tokens, of them reasoning) as the turn's TurnDone counted them."""
        completion = res.completion_tokens if res.completion_tokens is not None else res.chunks
        return completion, reasoning_tokens(res.reasoning_tokens, res.reasoning_chunks, completion, res.chunks)

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
        self.notice(
            "warn", f"{self.sid}: server unreachable, waiting up to {self.opts.reconnect_timeout:.0f}s", t=start
        )
        while self.clock() - start < self.opts.reconnect_timeout:
            await asyncio.sleep(2.0)
            try:
                r = await self.client.get(self.base_url + "/health", headers=self.headers, timeout=5.0)
                if r.status_code == 200:
                    self.notice("info", f"{self.sid}: server back after {self.clock() - start:.0f}s outage")
                    return True
            except httpx.HTTPError:
                pass
        self.notice("error", f"{self.sid}: server still gone after {self.opts.reconnect_timeout:.0f}s")
        return None

    def notice(self, level: ev.Level, message: str, t: float | None = None) -> None:
        """A line for the Events panel and the recording, about this session (at `t`, else now)."""
        self.emit(ev.Notice(t=self.clock() if t is None else t, level=level, session=self.sid, message=message))

    def _on_first(self, turn: int, reasoning: bool = False) -> Callable[[float], None]:
        return lambda t: self.emit(ev.FirstToken(t=t, session=self.sid, turn=turn, reasoning=reasoning))

    def _on_answer(self, turn: int) -> Callable[[float], None]:
        return lambda t: self.emit(ev.FirstAnswer(t=t, session=self.sid, turn=turn))

    def _on_times(self, turn: int) -> Callable[[list[float], list[int], ev.PiledUp | None], None]:
        return lambda times, counts, piled_up: self.emit(
            ev.TokenTimes(t=times[-1], session=self.sid, turn=turn, times=times, counts=counts, piled_up=piled_up)
        )


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
