"""--trace in a run: the trace read once before anything is sent (checked, so a bad row is bad input, and each
session's turns counted), the server's atoms and chat template measured for the prompts, then its requests read
again and handed to their sessions just before they are due, so memory holds the sessions live, not the file."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import httpx

from rampwatch.drivers.client.prompts import Corpus
from rampwatch.drivers.client.tokenizer import ServerTokenizer, over_httpx
from rampwatch.drivers.client.trace_prompt import (
    CANDIDATES,
    TracePrompts,
    corpus_candidates,
    find_atoms,
    measure_template,
)
from rampwatch.drivers.client.trace_session import TraceSessionRunner
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.trace_slice import TraceSlice
from rampwatch.drivers.run.config import BadInput, TraceOptions
from rampwatch.drivers.run.trace_read import TraceReading, open_trace

LEAD_S = 1.0  # the trace's due 0 is this long after the replay starts: its first sessions are made by then
AHEAD_S = 0.5  # a request is handed to its session this long before it is due
WARM_SALT_BYTES = 1 << 20  # --trace-warm: the salt is a digest of the trace's size and first MiB


def warm_salt(path: str) -> str:
    """The trace's own salt (--trace-warm): the same file gives the same prompts in every run."""
    with open(path, "rb") as f:
        head = f.read(WARM_SALT_BYTES)
    digest = hashlib.blake2b(head, digest_size=6, person=b"rampwatch-warm")
    digest.update(str(Path(path).stat().st_size).encode())
    return "warm-" + digest.hexdigest()


class TraceReplay:
    """One run's trace: read, checked and counted by `prepare`, replayed by `dispatch`."""

    def __init__(self, opts: TraceOptions):
        self.opts = opts
        self.cut = TraceSlice.of(opts)
        self.reading: TraceReading = open_trace(opts.path, opts.format, opts.block_size, opts.skip_bad)
        self.schedules: dict[str, list[int]] = {}  # each session's prompt sizes, in turn order
        self.starts: list[float] = []  # each session's first due time in the trace, in order
        self.prompts: TracePrompts | None = None

    def read(self, max_model_len: int | None) -> None:
        """Read the whole trace once: BadInput for a bad row (without --trace-skip-bad), for a trace with no
        request left, or for a request longer than the server takes."""
        schedules: dict[str, list[int]] = {}
        longest = 0  # prompt and output: what the server must hold for the request
        for r in self.reading.requests(self.cut, self.opts.kv_tokens):
            if r.session not in schedules:
                self.starts.append(r.due_s)
            schedules.setdefault(r.session, []).append(r.input_length)
            longest = max(longest, r.input_length + max(1, r.output_length))
        if not schedules:
            raise BadInput(f"{self.opts.path}: no request left to send (skipped: {self.reading.skipped or 'none'})")
        if max_model_len and longest > max_model_len:
            raise BadInput(
                f"{self.opts.path}: a request of {longest:,} tokens with its output, over the server's "
                f"max_model_len {max_model_len:,}; pass --trace-max-context {max_model_len * 9 // 10} to leave such "
                "requests out"
            )
        self.schedules = schedules

    async def measure(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        headers: dict[str, str],
        model: str,
        salt: str,
        corpus: Corpus | None = None,
    ) -> None:
        """What the prompts are made of on this server: its one-token atoms (from --corpus's words when given)
        and its chat template's tokens; their salt the run's, or with --trace-warm the trace's own."""
        if self.opts.warm:
            salt = warm_salt(self.opts.path)
        tokenizer = ServerTokenizer(over_httpx(client, base_url, headers), model)
        atoms = await find_atoms(tokenizer, salt, corpus_candidates(corpus.text) if corpus else CANDIDATES)
        chat = self.opts.api == "chat"
        template = await measure_template(tokenizer, atoms, chat)
        self.prompts = TracePrompts(atoms, salt, self.reading.block_size, template, chat)

    def header(self) -> ev.TraceRun:
        o = self.opts
        return ev.TraceRun(
            path=o.path,
            format=self.reading.format,
            block_size=self.reading.block_size,
            kv_tokens=o.kv_tokens,
            start_s=o.start_s,
            duration_s=o.duration_s,
            sessions=o.sessions,
            max_context=o.max_context,
            skipped=dict(self.reading.skipped),
            api=o.api,
            exact=self.prompts.atoms.exact if self.prompts is not None else False,
            timing=o.timing,
            speed=o.speed,
            warm=o.warm,
            sessions_per_s=self.sessions_per_s(),
        )

    def sessions_per_s(self) -> float | None:
        """Sessions starting a second at --trace-speed, over the slice from its first start to its last (None
        for a slice with one start)."""
        if len(self.starts) < 2 or self.starts[-1] <= self.starts[0]:
            return None
        return (len(self.starts) - 1) / (self.starts[-1] - self.starts[0]) * self.opts.speed

    async def dispatch(
        self,
        make: Callable[[str, float], TraceSessionRunner],
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        time_scale: float,
        tasks: list[asyncio.Task[bool]],
        until: float | None = None,
    ) -> None:
        """Every request to its session just before it is due (a session made, announced and started at its
        first); `make(session, origin)` makes a session's runner; nothing is handed on past `until` (the time
        limit). Returns once the last request has been handed on."""
        origin = clock() + LEAD_S
        left = {sid: len(sizes) for sid, sizes in self.schedules.items()}
        live: dict[str, TraceSessionRunner] = {}
        for r in self.reading.requests(self.cut, self.opts.kv_tokens):
            due = origin + r.due_s / (time_scale * self.opts.speed)
            if until is not None and due >= until:
                break
            await asyncio.sleep(max(0.0, due - AHEAD_S - clock()))
            runner = live.get(r.session)
            if runner is None:
                runner = live[r.session] = make(r.session, origin)
                planned = runner.plan_event(r)
                planned.schedule = self.schedules.get(r.session, [])
                emit(planned)
                tasks.append(asyncio.create_task(runner.run()))
            runner.turns.put_nowait(r)
            left[r.session] -= 1
            if left[r.session] == 0:
                runner.turns.put_nowait(None)
                del live[r.session]
        for runner in live.values():  # cut off by the time limit
            runner.turns.put_nowait(None)
