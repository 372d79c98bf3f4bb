"""Synthetic traces in every format rampwatch reads, deterministic from a seed.

    python tests/make_traces.py                                  # the small traces under tests/data/traces/
    python tests/make_traces.py mooncake --rows 100000 OUT.jsonl  # a large Mooncake trace, streamed to OUT

Hash ids follow how the formats define them: a prompt is a prefix of its session's token stream, cut into
blocks; a full block's id is the same wherever the same prefix is (so a session's turns, and sessions that open
with the same system prompt, share their leading blocks), and a partial last block gets an id of its own (its
content differs from the full block a later, longer prompt has there).
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import io
import itertools
import json
import random
import sys
from pathlib import Path

import msgspec

from rampwatch.drivers.model.events import Header, RequestSent, SessionPlanned, TurnDone

HERE = Path(__file__).resolve().parent
TRACES = HERE / "data" / "traces"
SEED = 35


class Ids:
    """Fresh block ids, never reused."""

    def __init__(self, start: int = 1):
        self._next = itertools.count(start)

    def take(self, n: int) -> list[int]:
        return [next(self._next) for _ in range(n)]


class Stream:
    """A session's token stream as blocks: the ids of its full blocks so far, shared leading ones first."""

    def __init__(self, ids: Ids, block: int, lead: list[int] | None = None):
        self.ids, self.block, self.full = ids, block, list(lead or [])

    def prompt(self, tokens: int) -> list[int]:
        """The hash ids of the stream's first `tokens` tokens (the stream grows to cover them)."""
        want = tokens // self.block
        if want > len(self.full):
            self.full += self.ids.take(want - len(self.full))
        partial = self.ids.take(1) if tokens % self.block else []
        return self.full[:want] + partial

    def fork(self, tokens: int) -> Stream:
        """A stream sharing this one's first `tokens` tokens' full blocks, then its own."""
        self.prompt(tokens)
        return Stream(self.ids, self.block, self.full[: tokens // self.block])


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def mooncake_small() -> str:
    """Three sessions (AIPerf session_id) and two lone rows, all opening with the same two 512-token blocks (a
    shared system prompt); one later turn gives a delay instead of a timestamp."""
    ids = Ids()
    lead = Stream(ids, 512).prompt(1024)
    rows = []
    for k, (start, sizes) in enumerate([(0, (1700, 2600, 3900)), (1000, (1500, 2300)), (2000, (1800, 3000, 3300))]):
        stream = Stream(ids, 512, lead)
        for turn, size in enumerate(sizes):
            row = {
                "session_id": f"s{k + 1}",
                "input_length": size,
                "output_length": 128,
                "hash_ids": stream.prompt(size),
            }
            at = start + 6000 * turn
            row["timestamp"] = at
            rows.append((at, row))
    for at in (2500, 9000):
        rows.append(
            (
                at,
                {
                    "timestamp": at,
                    "input_length": 1300,
                    "output_length": 64,
                    "hash_ids": Stream(ids, 512, lead).prompt(1300),
                },
            )
        )
    rows.sort(key=lambda r: r[0])
    out = []
    for at, row in rows:
        if row.get("session_id") == "s3" and at == 14000:  # s3's third turn, due 6 s after its second
            row = {k: v for k, v in row.items() if k != "timestamp"} | {"delay": 6000}
        out.append(dumps(row))
    return "\n".join(out) + "\n"


def mooncake_large(rows: int, seed: int, out: io.TextIOBase) -> None:
    """`rows` Mooncake rows with session ids: sessions arrive at random, each of 1 to 12 turns growing from
    2-16K tokens by 0.5-4K a turn, opening with one of 40 system prompts; written in due order as they come."""
    rng = random.Random(seed)
    ids = Ids()
    prompts = [Stream(ids, 512).prompt(512 * rng.randint(1, 8)) for _ in range(40)]
    live: list[tuple[int, int, dict]] = []  # (due ms, session number, its state)
    arrival, written, number = 0, 0, 0
    while written < rows:
        if not live or arrival <= live[0][0]:
            number += 1
            size = rng.randint(2048, 16384)
            state = {"stream": Stream(ids, 512, rng.choice(prompts)), "turns": rng.randint(1, 12), "size": size}
            heapq.heappush(live, (arrival, number, state))
            arrival += int(rng.expovariate(1 / 150))
            continue
        due, session, state = heapq.heappop(live)
        size = state["size"]
        row = {
            "timestamp": due,
            "session_id": f"s{session}",
            "input_length": size,
            "output_length": rng.randint(32, 512),
            "hash_ids": state["stream"].prompt(size),
        }
        out.write(dumps(row) + "\n")
        written += 1
        state["turns"] -= 1
        if state["turns"]:
            state["size"] = size + rng.randint(512, 4096)
            heapq.heappush(live, (due + int(rng.expovariate(1 / 20000)) + 1, session, state))


def mooncake_paced(
    sessions: int, requests_per_s: float, seed: int, out: io.TextIOBase, turns: int = 2, gap_s: float = 2.0
) -> None:
    """A replay benchmark's trace: `sessions` sessions of `turns` short turns `gap_s` apart, arriving (Poisson) so
    the trace asks for `requests_per_s` requests a second; each opens with one of 4 two-block system prompts, its
    first turn 1-3K tokens, each later one 300 more, 16 tokens out. Written in due order."""
    rng = random.Random(seed)
    ids = Ids()
    prompts = [Stream(ids, 512).prompt(1024) for _ in range(4)]
    per_s = requests_per_s / turns  # sessions arriving a second
    live: list[tuple[int, int, dict]] = []
    arrival_ms, started = 0.0, 0
    while started < sessions or live:
        if started < sessions and (not live or arrival_ms <= live[0][0]):
            started += 1
            state = {"stream": Stream(ids, 512, rng.choice(prompts)), "left": turns, "size": rng.randint(1024, 3072)}
            heapq.heappush(live, (int(arrival_ms), started, state))
            arrival_ms += rng.expovariate(per_s) * 1000
            continue
        due, session, state = heapq.heappop(live)
        row = {
            "timestamp": due,
            "session_id": f"s{session}",
            "input_length": state["size"],
            "output_length": 16,
            "hash_ids": state["stream"].prompt(state["size"]),
        }
        out.write(dumps(row) + "\n")
        state["left"] -= 1
        if state["left"]:
            state["size"] += 300
            heapq.heappush(live, (due + int(gap_s * 1000), session, state))


def bailian_rows() -> list[dict]:
    """Two chains opening with the same three 16-token blocks; chat 2 has two children: 3 continues its chain,
    4 (later) is a branch sharing chat 2's prefix; chat 5 continues the branch."""
    ids = Ids(1000)
    lead = Stream(ids, 16).prompt(48)
    a = Stream(ids, 16, lead)
    b = Stream(ids, 16, lead)
    rows = []

    def row(chat: int, parent: int, t: float, size: int, stream: Stream, turn: int, kind: str = "text") -> None:
        rows.append(
            {
                "chat_id": chat,
                "parent_chat_id": parent,
                "timestamp": t,
                "input_length": size,
                "output_length": 40,
                "type": kind,
                "turn": turn,
                "hash_ids": stream.prompt(size),
            }
        )

    row(1, -1, 0.0, 120, a, 1)
    row(10, -1, 1.5, 90, b, 1)
    row(2, 1, 4.0, 260, a, 2)
    row(11, 10, 6.0, 200, b, 2, "image")
    row(3, 2, 9.0, 420, a, 3)
    branch = a.fork(260 + 40)
    row(4, 2, 12.0, 380, branch, 3)
    row(5, 4, 15.5, 560, branch, 4)
    return rows


def bailian_jsonl() -> str:
    return "".join(dumps(r) + "\n" for r in bailian_rows())


def bailian_csv() -> str:
    columns = ["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn", "hash_ids"]
    lines = [",".join(columns)]
    for r in bailian_rows():
        cells = [str(r[c]) for c in columns[:-1]] + ['"' + dumps(r["hash_ids"]) + '"']
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n"


def agentic_conversations(seed: int = SEED) -> list[dict]:
    """Three coding-agent conversations opening with the same 8K-token harness prompt, each growing to about
    200K tokens in six requests, with subagents that fork off the conversation's prefix (its first 24K tokens)
    and add a task of their own; the second conversation's two subagent requests are one agent."""
    rng = random.Random(seed)
    ids = Ids(100_000)
    harness = Stream(ids, 64).prompt(8192)
    conversations = []
    for c, start in enumerate((0.0, 45.0, 90.0)):
        main = Stream(ids, 64, harness)
        t = start
        requests = []
        sizes = [24_000, 58_000, 96_000, 131_000, 167_000, 199_000 + 173 * c]
        # The second conversation's subagent requests are one agent (a session of two turns): its stream is kept.
        reviewer = main.fork(24_000) if c == 1 else None
        for k, size in enumerate(sizes):
            requests.append(
                {
                    "t": round(t, 3),
                    "in": size,
                    "out": rng.randint(200, 900),
                    "hash_ids": main.prompt(size),
                    "type": "main",
                }
            )
            t += rng.uniform(8, 20)
            if k in (1, 3):
                sub_size = (24_000 if k == 1 else 33_000) + rng.randint(3000, 9000)
                stream = reviewer or main.fork(24_000)
                sub = {
                    "t": round(t, 3),
                    "in": sub_size,
                    "out": rng.randint(100, 400),
                    "hash_ids": stream.prompt(sub_size),
                    "type": "subagent",
                }
                if reviewer is not None:
                    sub["agent"] = "reviewer"
                requests.append(sub)
                t += rng.uniform(4, 10)
        conversations.append({"id": f"agent{c + 1}", "requests": requests})
    return conversations


def agentic_jsonl() -> str:
    return "".join(dumps(c) + "\n" for c in agentic_conversations())


def aiperf_jsonl() -> str:
    """AIPerf multi_turn: three sessions; one gives text instead of lengths, one starts at a timestamp."""
    sessions = [
        {
            "session_id": "chat-a",
            "turns": [
                {"input_length": 300, "output_length": 60},
                {"input_length": 120, "output_length": 60, "delay": 4000},
                {"input_length": 200, "output_length": 80, "delay": 7000},
            ],
        },
        {
            "session_id": "chat-b",
            "turns": [
                {
                    "text": "Summarize the design document in three bullet points, then list its open questions.",
                    "output_length": 90,
                    "timestamp": 1500,
                },
                {"text": "Now rewrite the second bullet for a new engineer.", "output_length": 50, "delay": 3000},
            ],
        },
        {
            "session_id": "chat-c",
            "turns": [
                {"input_length": 800, "output_length": 30, "timestamp": 2500},
                {"input_length": 100, "output_length": 30, "timestamp": 9000},
            ],
        },
    ]
    return "".join(dumps(s) + "\n" for s in sessions)


def recording_jsonl() -> str:
    """A small rampwatch recording: two sessions of three turns; the first session's second turn is sent twice
    (a retry) and the second session's last turn failed."""
    enc = msgspec.json.Encoder()
    header = Header(
        rampwatch_version="0.1.0",
        command=["rampwatch", "demo"],
        mode="demo",
        server="sim",
        sessions=2,
        output_tokens=64,
        salt="tracegen",
    )
    events: list = [header]
    schedule = [1000, 2000, 4000]
    for s in ("s1", "s2"):
        events.append(SessionPlanned(t=0.0, session=s, schedule=schedule, salt=f"salt-{s}"))
    t = 0.0
    for turn, target in enumerate(schedule, 1):
        for k, s in enumerate(("s1", "s2")):
            sent = t + 0.1 * k
            events.append(
                RequestSent(
                    t=sent, session=s, turn=turn, target_tokens=target, new_tokens_est=1000, body_bytes=4 * target
                )
            )
        if turn == 2:  # s1's second turn fails once and is sent again: still one turn, due at its first send
            events.append(TurnDone(t=t + 0.5, session="s1", turn=2, status="failed", error="connection dropped"))
            events.append(
                RequestSent(
                    t=t + 0.6,
                    session="s1",
                    turn=2,
                    target_tokens=target,
                    new_tokens_est=1000,
                    body_bytes=4 * target,
                    attempt=2,
                )
            )
        for k, s in enumerate(("s1", "s2")):
            done = t + 1.0 + 0.3 * k
            if s == "s2" and turn == 3:
                events.append(TurnDone(t=done, session=s, turn=turn, status="failed", error="timeout"))
            else:
                events.append(
                    TurnDone(
                        t=done,
                        session=s,
                        turn=turn,
                        status="ok",
                        prompt_tokens=target + 7 * turn,
                        cached_tokens=0,
                        completion_tokens=64,
                    )
                )
        t += 5.0
    return "".join(enc.encode(e).decode() + "\n" for e in events)


def gzipped(text: str) -> bytes:
    """Deterministic gzip (no file name, no time in the header)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
        f.write(text.encode())
    return buf.getvalue()


def small_traces() -> dict[str, bytes]:
    """File name under tests/data/traces/ -> its bytes."""
    return {
        "mooncake.jsonl": mooncake_small().encode(),
        "bailian.csv": bailian_csv().encode(),
        "bailian.jsonl": bailian_jsonl().encode(),
        "agentic.jsonl.gz": gzipped(agentic_jsonl()),
        "aiperf.jsonl": aiperf_jsonl().encode(),
        "recording.jsonl": recording_jsonl().encode(),
    }


def write_small(folder: Path = TRACES) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in small_traces().items():
        path = folder / name
        path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("format", nargs="?", choices=["mooncake"], help="write a large trace of this format to OUT")
    p.add_argument("out", nargs="?", type=Path, help="where the large trace goes")
    p.add_argument("--rows", type=int, default=100_000, help="rows in the large trace (default 100000)")
    p.add_argument("--seed", type=int, default=SEED, help=f"the random seed (default {SEED})")
    args = p.parse_args(argv)
    if args.format is None:
        for path in write_small():
            print(f"{path.relative_to(HERE.parent)}  {path.stat().st_size:,} bytes")
        return 0
    if args.out is None:
        p.error("a large trace needs OUT")
    with open(args.out, "w", encoding="utf-8") as f:
        mooncake_large(args.rows, args.seed, f)
    print(f"{args.out}  {args.rows:,} rows  {args.out.stat().st_size:,} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
