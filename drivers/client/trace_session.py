"""One session of a trace (--trace): its turns as the trace gives them, its prompt the turn's hash-id blocks
(trace_prompt.py). Nothing of a reply is re-sent: the trace's next turn already says what its prompt is. A turn
the trace gives as text (AIPerf's `text`, `text_input`) is sent as written instead: the session's messages so far,
the replies it got among them, and this one.

When a turn is due: its first at its time in the trace; a later one (--trace-timing session, the default) the
trace's gap between the two turns after the previous reply ended, a user who waits for the answer, or (open) at
its time in the trace. Times and gaps are divided by --trace-speed (and a demo's time scale). A turn sent after
it was due (its previous reply still streaming under open timing, or the client behind) is late and says so,
as an open-loop arrival does."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import httpx

from rampwatch.drivers.client.chat import chat_body, completion_body, encode_message
from rampwatch.drivers.client.session import Gate
from rampwatch.drivers.client.streamer import TurnOptions, TurnPlan, TurnStreamer
from rampwatch.drivers.client.trace_prompt import TracePrompts
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.trace import TraceRequest


class TraceSessionRunner(TurnStreamer):
    """A trace session's turns, fed in due order through `turns` (None: the session has no more)."""

    def __init__(
        self,
        sid: str,
        prompts: TracePrompts,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        opts: TurnOptions,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        origin: float,
        speed: float = 1.0,
        chained: bool = True,
        gate: Gate | None = None,
        tls: ssl.SSLContext | None = None,
    ):
        """`origin`: the run clock's time at the trace's due 0; `speed`: --trace-speed; `chained`: --trace-timing
        session (a later turn due its gap after the previous reply)."""
        super().__init__(sid, client, base_url, headers, opts, emit, clock, prompts.salt, tls)
        self.prompts, self.origin, self.gate, self.chained = prompts, origin, gate, chained
        self.scale = opts.time_scale * speed  # trace seconds per run-clock second
        self.turns: asyncio.Queue[TraceRequest | None] = asyncio.Queue()
        self.failed = False
        self.previous: tuple[float, float] | None = None  # the last turn's (due in the trace, reply's end)
        self.said: list[tuple[str, str]] = []  # a text trace's conversation so far: (role, text)
        # --workers-restart on a worker: what each text turn added to `said` goes to the coordinator, from `kept` on.
        self.keep_said: Callable[[list[tuple[str, str]]], None] | None = None
        self.kept = 0

    def due(self, request: TraceRequest) -> float:
        """When the request is due on the run's clock."""
        if self.chained and self.previous is not None:
            due_s, ended = self.previous
            return ended + max(0.0, request.due_s - due_s) / self.scale
        return self.origin + request.due_s / self.scale

    def plan_event(self, first: TraceRequest) -> ev.SessionPlanned:
        """The session as it starts: how many turns it has is not known until the trace says (schedule empty)."""
        return ev.SessionPlanned(
            t=self.clock(),
            session=self.sid,
            schedule=[],
            salt=self.salt,
            endpoint=ev.endpoint_name(self.base_url),
            arrival=self.due(first),
        )

    async def run(self) -> bool:
        """Every turn fed until None, the time limit, or the server gone; True when none failed."""
        try:
            while (request := await self.turns.get()) is not None:
                await asyncio.sleep(max(0.0, self.due(request) - self.clock()))
                if self.gate is not None and self.gate.time_up:  # the limit came while it waited for the turn
                    break
                if await self.run_turn(request) == "gone":
                    self.failed = True
                    return False
                self.previous = (request.due_s, self.last_end())
            return not self.failed
        finally:
            if self.gate is not None:
                self.gate.leave()
            self.conn.close()

    async def run_turn(self, request: TraceRequest) -> str:
        o = self.opts
        out = max(1, request.output_length)
        if request.text is not None:
            return await self._run_written(request, out)
        pieces = self.prompts.content(request.hash_ids, request.input_length)
        if self.prompts.chat:
            body, path = chat_body(o.model, [encode_message("user", pieces)], out, o.ignore_eos, o.extra_body), None
        else:  # the prompt as it is, no template: shared blocks are shared tokens, to the last one
            body, path = completion_body(o.model, pieces, out, o.ignore_eos, o.extra_body), self.completions_path
        plan = TurnPlan(
            target=request.input_length,
            new_tokens_est=request.input_length - (request.ideal_cached or 0),
            text="".join(pieces) if o.record_text else None,
            due=self.due(request),
            ideal_cached=request.ideal_cached,
            ideal_cached_pool=request.ideal_cached_pool,
        )
        return await self._send(request, body, plan, path)

    async def _run_written(self, request: TraceRequest, out: int) -> str:
        """A turn the trace gives as text: the conversation so far and this message, as a chat or one raw prompt."""
        o = self.opts
        assert request.text is not None
        self.said.append(("user", request.text))
        if self.prompts.chat:
            body = chat_body(o.model, [encode_message(role, [text]) for role, text in self.said], out, o.ignore_eos,
                             o.extra_body)  # fmt: skip
            path = None
        else:
            texts = [text + "\n\n" for _, text in self.said[:-1]] + [request.text]  # one raw prompt, turn by turn
            body, path = completion_body(o.model, texts, out, o.ignore_eos, o.extra_body), self.completions_path
        plan = TurnPlan(
            target=request.input_length,
            new_tokens_est=request.input_length - (request.ideal_cached or 0),
            text=request.text if o.record_text else None,
            due=self.due(request),
            ideal_cached=request.ideal_cached,
            ideal_cached_pool=request.ideal_cached_pool,
        )
        return await self._send(request, body, plan, path)

    async def _send(self, request: TraceRequest, body: list[bytes], plan: TurnPlan, path: str | None) -> str:
        outcome, res = await self.send(request.turn, body, plan, lambda _res: None, path)
        if request.text is not None and res is not None:
            self.said.append(("assistant", res.text))
        if self.keep_said is not None and len(self.said) > self.kept:
            self.keep_said(self.said[self.kept :])
            self.kept = len(self.said)
        self.failed = self.failed or outcome != "ok"
        return outcome
