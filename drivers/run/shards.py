"""How a run's sessions are spread over driver workers (--workers N, --cluster) and shards (--shard I/N): session
k (1-based) runs on worker (k-1) mod N, so a session's turns stay on one worker and the same seed gives the same
sessions whatever N is. A trace's sessions are numbered k by first appearance and spread alike."""

from __future__ import annotations

import hashlib
import os
import re
from datetime import UTC, datetime

from rampwatch.drivers.run.config import BadInput, RunConfig


def worker_of(k: int, workers: int) -> int:
    """The worker (0-based) that runs session k (1-based)."""
    return (k - 1) % workers


def sessions_of(worker: int, workers: int, sessions: int) -> list[int]:
    """The sessions (1-based) worker `worker` of `workers` runs, of `sessions` in all."""
    return list(range(worker + 1, sessions + 1, workers))


def parse_workers(text: str) -> int:
    """--workers N|auto: auto is one per core beyond the first (the coordinator's), at least one."""
    if text == "auto":
        return max(1, (os.cpu_count() or 1) - 1)
    try:
        n = int(text)
    except ValueError:
        raise BadInput(f"--workers {text!r}: a number of driver processes or auto") from None
    if n < 1:
        raise BadInput(f"--workers {text!r}: at least 1")
    return n


def parse_shard(text: str) -> tuple[int, int]:
    """--shard I/N: shard I (0-based, as a Kubernetes Indexed Job's JOB_COMPLETION_INDEX) of N."""
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if m is None or int(m[2]) < 1 or int(m[1]) >= int(m[2]):
        raise BadInput(f"--shard {text!r}: I/N with 0 <= I < N, e.g. 0/3")
    return int(m[1]), int(m[2])


def parse_start_at(text: str) -> float:
    """--start-at TIME: an ISO 8601 wall-clock time (a zone, or UTC) or Unix seconds; returns Unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"--start-at {text!r}: an ISO 8601 time like 2026-12-03T20:00:00Z, or Unix seconds") from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def seeded_salt(seed: int, tag: str = "") -> str:
    """--seed's prompts: the salt every session's text is drawn from, the same for the same seed whatever runs it
    (one driver, N workers, N shards that never talk), so their prompts and sizes are the same."""
    return hashlib.sha256(f"rampwatch-seed-{seed}-{tag}".encode()).hexdigest()[:12]


def check_workers(cfg: RunConfig) -> None:
    """What a run spread over workers or shards cannot do (yet), said before it starts."""
    if cfg.shard is not None:
        if cfg.seed is None or cfg.start_at is None:
            raise BadInput("--shard I/N is one part of a run: give every shard the same --seed and --start-at")
        if cfg.lockstep:
            raise BadInput("--lockstep needs one barrier for all sessions: shards never talk; use --workers N")
    if (cfg.workers > 1 or cfg.cluster is not None) and cfg.concurrency is not None:
        raise BadInput("concurrency runs in one driver process for now: not with --workers or --cluster")
