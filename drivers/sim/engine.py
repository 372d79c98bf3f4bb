"""The simulated engine: a step-based scheduler like vLLM V1 over a KV pool.

Each step has a token budget: running decodes go first (one token each),
prefill chunks fill the rest, waiting requests are admitted while blocks and
sequence slots last. The step then takes the profile's modelled time, so a
long prefill sharing steps with a decode slows that decode just as on a GPU.
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import itertools
import random
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rampwatch.drivers.sim.clock import SimClock, WallClock
from rampwatch.drivers.sim.kvcache import KVPool
from rampwatch.drivers.sim.profiles import SimProfile

_ASK = b"access code of "
_REPLY_WORDS = (
    "the of and to in is that it for on as with was by at this be from or an are not which but have has all "
    "their were one can we more will there so some these would into what when out up about other than then"
).split()


def count_tokens(data: bytes, chars_per_token: int) -> int:
    """The deterministic tokenizer: every `chars_per_token` bytes are a token."""
    return -(-len(data) // chars_per_token)


def token_ids(data: bytes, chars_per_token: int) -> list[int]:
    """The tokens count_tokens counts, as ids: each `chars_per_token` bytes read as a little-endian number (the
    last, short one as if padded with zeros)."""
    kind = _UNSIGNED.get(chars_per_token)
    if kind is None or sys.byteorder != "little":
        return [int.from_bytes(data[i : i + chars_per_token], "little") for i in range(0, len(data), chars_per_token)]
    # In one C call: a long reply's /tokenize (the client counts every reply) was half the 'fast' engine's CPU.
    return array.array(kind, data + bytes(-len(data) % chars_per_token)).tolist()


_UNSIGNED = {a.itemsize: a.typecode for a in (array.array(t) for t in "BHIQ")}  # unsigned ints by their size


def role_line(role: object) -> str:
    """A message's opening line, padded to whole tokens of 4 bytes (as a real template's role markers are tokens
    of their own), so the message's text starts on a token boundary."""
    line = f"<|{role}|>"
    return line + " " * (-(len(line) + 1) % 4) + "\n"


def render_chat(messages: list[dict[str, object]]) -> bytes:
    """The chat template: a role line before each message, then the assistant's turn."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{role_line(m.get('role', 'user'))}{content or ''}\n")
    parts.append(role_line("assistant"))
    return "".join(parts).encode()


def reply_words(prompt: bytes, seed: int) -> tuple[list[str], bool]:
    """(reply tokens, ends by itself): the planted fact when the last question
    asks for it and the prompt holds it, otherwise filler words."""
    tail = prompt[-2048:]
    at = tail.rfind(_ASK)
    end = tail.find(b"?", at)
    if at >= 0 and 0 < end - at - len(_ASK) <= 80:
        who = tail[at + len(_ASK) : end]
        m = re.search(rb"access code of " + re.escape(who) + rb" is ([A-Za-z0-9-]+)", prompt)
        if m:
            answer = f"The access code of {who.decode(errors='replace')} is {m.group(1).decode()}."
            return [(" " if i else "") + w for i, w in enumerate(answer.split())], True
    rng = random.Random(seed)
    return [" " + rng.choice(_REPLY_WORDS) for _ in range(64)], False


# A reasoning model's thinking, as the simulated engine streams it (never the needle's code).
_REASONING_WORDS = [" " + w for w in "let me think about what was asked and where the fact was".split()]

CATCH_UP_S = 0.05  # the most modelled time the engine makes up after its loop was held up


@dataclass(eq=False)
class SimRequest:
    prompt: bytes
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    hashes: list[bytes]
    words: list[str]
    ends_itself: bool
    arrival: float = field(default_factory=time.monotonic)  # when it joined the queue
    received: float | None = None  # when the front end took it, where that came before the queue (its template)
    id: int = field(default_factory=itertools.count().__next__)
    computed: int = 0  # tokens whose KV is in the pool (cached + computed)
    cached_tokens: int = 0
    generated: int = 0
    blocks: list[int] = field(default_factory=list)
    scheduled_t: float | None = None
    first_t: float | None = None
    last_t: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    preemptions: int = 0
    remote_kv: bool = False  # prefill/decode split: the prompt's KV comes from the prefill node ...
    ready_at: float = 0.0  # ... and is here (the engine's clock) once the transfer is done
    local_cached: int = 0  # of cached_tokens, those this node's own prefix cache held
    registered: int = 0  # prompt blocks findable in the prefix cache so far
    reasoning: int = 0  # tokens of thinking before the answer (a reasoning model's), streamed as reasoning_content

    @property
    def taken(self) -> float:
        """When the server took the request: its front end began (received), else it joined the queue. vLLM's
        arrival time, which its TTFT and end-to-end latency count from."""
        return self.received if self.received is not None else self.arrival

    @property
    def target_len(self) -> int:
        """Tokens that must be in the pool before the next token can be sampled."""
        return self.prompt_tokens + max(0, self.generated - 1) if self.first_t else self.prompt_tokens

    def word(self, g: int) -> str:
        """The word of generated token g (0-based): the thinking's, then the reply's (its words repeat)."""
        k = g - self.reasoning
        return _REASONING_WORDS[g % len(_REASONING_WORDS)] if k < 0 else self.words[k % len(self.words)]

    def text(self, lo: int, hi: int) -> str:
        """Generated tokens lo..hi-1 as text."""
        return "".join(self.word(g) for g in range(lo, hi))

    def is_reasoning(self, k: int) -> bool:
        """Whether generated token k (0-based) is thinking rather than answer."""
        return k < self.reasoning

    def tokens_left(self) -> int:
        """Tokens still to come: up to max_tokens, or to the end of a reply that ends by itself."""
        left = self.max_tokens - self.generated
        if self.ends_itself and not self.ignore_eos:
            left = min(left, self.reasoning + len(self.words) - self.generated)
        return max(0, left)

    def wants_more(self) -> bool:
        return self.tokens_left() > 0


@dataclass
class StepStats:
    """What the metrics layer needs to know about finished work."""

    on_admit: Callable[[SimRequest], None] = lambda r: None
    on_first: Callable[[SimRequest], None] = lambda r: None
    # `n` tokens at once: the first `dt` after the one before, the rest in the same step (0 s apart: a burst)
    on_tokens: Callable[[SimRequest, float, int], None] = lambda r, dt, n: None
    on_finish: Callable[[SimRequest], None] = lambda r: None
    on_step: Callable[[int], None] = lambda n: None
    on_preempt: Callable[[SimRequest], None] = lambda r: None


class SimEngine:
    def __init__(self, profile: SimProfile, stats: StepStats | None = None, clock: SimClock | None = None):
        self.profile = profile
        self.clock = clock or WallClock()  # a VirtualClock in tests: steps take no real time
        self.pool = KVPool(profile.kv_tokens // profile.block_size, profile.block_size)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = stats or StepStats()
        self._work = asyncio.Event()
        self.busy = {"prefill": 0.0, "decode": 0.0}

    # -- requests ------------------------------------------------------------

    def make_request(self, prompt: bytes, max_tokens: int, ignore_eos: bool, reasoning: int = 0) -> SimRequest:
        """`reasoning`: tokens of thinking before the answer (all counted against max_tokens)."""
        p = self.profile
        n = count_tokens(prompt, p.chars_per_token)
        block_bytes = p.block_size * p.chars_per_token
        h = hashlib.blake2b(digest_size=16)
        hashes = []
        for i in range(n // p.block_size):
            h.update(prompt[i * block_bytes : (i + 1) * block_bytes])
            hashes.append(h.copy().digest())
        words, ends = reply_words(prompt, seed=len(prompt))
        return SimRequest(
            prompt=prompt,
            prompt_tokens=n,
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            hashes=hashes,
            words=words,
            ends_itself=ends,
            arrival=self.clock.now(),
            reasoning=reasoning,
        )

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self._work.set()

    def abort(self, req: SimRequest) -> None:
        """The client went away: free its slot and blocks."""
        if req.finished:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
            self.pool.release(req.blocks)
            req.blocks = []
        req.finished, req.finish_reason = True, "abort"
        self.stats.on_finish(req)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- scheduling ----------------------------------------------------------

    def _blocks_for(self, req: SimRequest, upto: int) -> bool:
        need = -(-upto // self.profile.block_size) - len(req.blocks)
        if need <= 0:
            return True
        got = self.pool.allocate(need)
        if got is None:
            return False
        req.blocks += got
        return True

    def _preempt(self, victim: SimRequest) -> None:
        self.running.remove(victim)
        self.pool.release(victim.blocks)
        victim.blocks, victim.computed, victim.cached_tokens = [], 0, 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self.stats.on_preempt(victim)

    def cached_prefix(self, hashes: list[bytes]) -> int:
        """Tokens of this prefix the pool holds now (nothing is taken)."""
        n = 0
        for h in hashes:
            if h not in self.pool.cached:
                break
            n += 1
        return n * self.profile.block_size

    def _admit(self, req: SimRequest) -> None:
        bs = self.profile.block_size
        blocks = self.pool.match(req.hashes)
        req.blocks = blocks
        # The last prompt token is always recomputed, as in vLLM.
        req.computed = req.cached_tokens = req.local_cached = min(len(blocks) * bs, req.prompt_tokens - 1)
        req.registered = len(blocks)
        if req.remote_kv:  # the rest of the prompt arrived from the prefill node
            req.computed = req.cached_tokens = req.prompt_tokens - 1

    def schedule(self) -> tuple[list[tuple[SimRequest, int]], list[SimRequest]]:
        """One step's work: (prefill chunks, decoding requests)."""
        budget = self.profile.max_num_batched_tokens
        decodes: list[SimRequest] = []
        prefills: list[tuple[SimRequest, int]] = []
        for req in list(self.running):
            if req not in self.running:
                continue  # preempted while making room for an earlier one
            remaining = req.target_len - req.computed
            if remaining <= 0:
                if budget < 1:
                    continue
                # Slots for the KV this step computes, as vLLM allocates them: the last token sampled and those
                # emitted after it in the step (burst), never the step's last one, whose KV no step computes.
                need = req.prompt_tokens + req.generated + min(self.profile.burst, req.tokens_left()) - 1
                while not self._blocks_for(req, need):
                    victim = self.running[-1]
                    self._preempt(victim)
                    if victim is req:
                        break
                else:
                    decodes.append(req)
                    budget -= 1
                continue
            chunk = min(budget, remaining)
            if chunk <= 0:
                continue
            while not self._blocks_for(req, req.computed + chunk):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            else:
                prefills.append((req, chunk))
                budget -= chunk
        now = self.clock.now()
        while self.waiting and budget > 0 and len(self.running) < self.profile.max_num_seqs:
            req = self.waiting[0]
            if req.ready_at > now:  # its KV is still on the way: the first one that has arrived goes first
                req = next((r for r in self.waiting if r.ready_at <= now), None)
                if req is None:
                    break
            self._admit(req)
            chunk = min(budget, req.target_len - req.computed)
            if not self._blocks_for(req, req.computed + chunk):
                self.pool.release(req.blocks)  # no room yet: wait for blocks to free up
                req.blocks = []
                break
            self.waiting.remove(req)
            self.running.append(req)
            if req.scheduled_t is None:
                req.scheduled_t = self.clock.now()
                self.stats.on_admit(req)
            prefills.append((req, chunk))
            budget -= chunk
        return prefills, decodes

    def _emit(self, req: SimRequest, now: float, n: int = 1) -> None:
        """`n` tokens of `req` (a burst: several in one step, as speculative decoding gives them) in one call, so
        the 'fast' profile's stream costs its process little beside the client it measures."""
        if req.first_t is None:
            req.first_t = now
            self.stats.on_first(req)
            if n > 1:
                self.stats.on_tokens(req, 0.0, n - 1)
        else:
            self.stats.on_tokens(req, now - (req.last_t or now), n)
        req.generated += n  # its words are req.word(g): the stream renders them from the count
        req.last_t = now
        if not req.wants_more():
            req.finished = True
            req.finish_reason = "length" if req.generated >= req.max_tokens else "stop"
            self.running.remove(req)
            self.pool.release(req.blocks)
            req.blocks = []
            self.stats.on_finish(req)
        req.wake.set()

    def _complete(self, prefills: list[tuple[SimRequest, int]], decodes: list[SimRequest]) -> None:
        now = self.clock.now()
        bs = self.profile.block_size
        for req, chunk in prefills:
            if req.finished:
                continue
            req.computed += chunk
            # Transferred KV (a split's decode node) becomes findable here too, as computed KV does.
            full_now = min(min(req.computed, req.prompt_tokens) // bs, len(req.hashes), len(req.blocks))
            for i in range(req.registered, full_now):
                self.pool.register(req.blocks[i], req.hashes[i])
            req.registered = max(req.registered, full_now)
            if req.computed >= req.target_len:
                self._emit(req, now)
        for req in decodes:
            # `burst` > 1 (the 'fast' profile) emits several tokens a step, as speculative decoding can.
            n = min(self.profile.burst, req.tokens_left())
            if n and not req.finished:
                req.computed = req.prompt_tokens + req.generated + n - 1
                self._emit(req, now, n)
        self.stats.on_step(sum(c for _, c in prefills) + len(decodes))

    async def run(self) -> None:
        """The engine loop: step while there is work, each step ending when the
        modelled clock says. Steps end on deadlines, not after sleeps: a sleep
        that overshoots (a busy CPU) is made up by the next, so modelled time
        does not drift on a loaded machine; a lag beyond CATCH_UP_S is let go
        rather than made up in a burst."""
        p, clock = self.profile, self.clock
        deadline = clock.now()
        while True:
            if not self.running and not self.waiting:
                self._work.clear()
                await self._work.wait()
                deadline = clock.now()
            prefills, decodes = self.schedule()
            if not prefills and not decodes:
                await clock.sleep_until(clock.now() + 0.001)  # waiting for blocks another request will free
                deadline = clock.now()
                continue
            dt = p.step_time([(r.computed, c) for r, c in prefills], [r.prompt_tokens + r.generated for r in decodes])
            deadline = max(deadline, clock.now() - CATCH_UP_S) + dt
            await clock.sleep_until(deadline)
            # Seconds the GPUs spent in steps with a prefill chunk (compute-bound), and in decode-only steps.
            self.busy["prefill" if prefills else "decode"] += dt
            self._complete(prefills, decodes)
