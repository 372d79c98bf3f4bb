"""A run's sessions, made alike wherever they run: in the one driver, in each worker (--workers N, --cluster),
in each shard (--shard I/N). Session k's conversation has its own salt and the run's lead, its own place in
the corpus, and goes to its --pin or its round-robin server: all from the plan, never from where it runs."""

from __future__ import annotations

import ssl
from collections.abc import Callable

import httpx

from rampwatch.drivers.client.prompts import Corpus
from rampwatch.drivers.client.ramp import Conversation
from rampwatch.drivers.client.session import Gate, SessionRunner
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.prompt_shape import corpus_reader
from rampwatch.drivers.run.worker_wire import SessionPlan


def conversation(cfg: RunConfig, plan: SessionPlan, corpus: Corpus | None, k: int) -> Conversation:
    """Session k's conversation (1-based): its own salt, so sessions share no prefix beyond the run's lead;
    with --corpus, its own place in the corpus."""
    source = corpus_reader(corpus, plan.salt, k, plan.sessions + 1)
    return Conversation(f"{plan.salt}-s{k}", cfg.schedule, plan.calibration, plan.lead, source)


def session_client(cfg: RunConfig, tls: ssl.SSLContext) -> httpx.AsyncClient:
    """An httpx client of its own for one session's /health calls during an outage (or the probe's): httpx's
    pool walks every connection on each request, so one pool shared by 64 sessions was costly; it opens no
    connection until used (a session's /tokenize goes over its own streaming connection)."""
    return httpx.AsyncClient(
        trust_env=False,  # no proxy from the environment: the same direct route as the streams
        verify=tls,
        timeout=httpx.Timeout(cfg.request_timeout, connect=10.0),
        limits=httpx.Limits(max_connections=2, max_keepalive_connections=2),
    )


class SessionMaker:
    """Makes session k's runner, emitting to `emit` on `clock`; `client_for()` gives each its own httpx client."""

    def __init__(
        self,
        cfg: RunConfig,
        plan: SessionPlan,
        corpus: Corpus | None,
        emit: Callable[[ev.AnyEvent], None],
        clock: Callable[[], float],
        tls: ssl.SSLContext,
        client_for: Callable[[], httpx.AsyncClient],
    ):
        self.cfg, self.plan, self.corpus = cfg, plan, corpus
        self.emit, self.clock, self.tls, self.client_for = emit, clock, tls, client_for
        self.opts = cfg.turn_options(plan.model, plan.salt)

    def session(self, k: int, gate: Gate) -> SessionRunner:
        sid, cfg = f"s{k}", self.cfg
        return SessionRunner(
            sid,
            conversation(cfg, self.plan, self.corpus, k),
            self.client_for(),
            cfg.target_for(sid, k),
            cfg.headers(),
            self.opts,
            self.emit,
            self.clock,
            gate=gate,
            tls=self.tls,
        )
