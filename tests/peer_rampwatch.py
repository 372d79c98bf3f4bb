#!/usr/bin/env python3
"""rampwatch as a client of ../shared/bench/peers/peerbench.py (its --custom contract).

Sends `-n` fresh one-turn conversations of about `--isl` prompt tokens, `-c`
at a time, through rampwatch's own driver (the same Run as `rampwatch run`:
metrics scraping and recording on), asking for exactly `--osl` tokens, and
writes one JSON line per request: ttft_s, start_wall, ok.

  peerbench.py ttft --clients bare,rampwatch --custom \\
    'rampwatch=/path/to/rampwatch/.venv/bin/python /path/to/rampwatch/tests/peer_rampwatch.py \\
     --url {url} --model {model} --isl {input_tokens} --osl {output_tokens} -n {num_requests} \\
     -c {concurrency} --seed {seed} --out {out}'
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from rampwatch.drivers.run import event_loop
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.runner import Run


async def main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="rampwatch-peer-"))
    # n one-turn sessions, c in flight at once: one run, one recording, one calibration.
    cfg = RunConfig(
        url=args.url,
        model=args.model,
        sessions=args.n,
        concurrency=args.c,
        schedule=[args.isl],
        output_tokens=args.osl,
        ignore_eos=True,
        metrics_urls=[args.url.rstrip("/") + "/metrics"],
        gpu="none",
        record=folder / "peer.jsonl",
    )
    run = Run(cfg)
    await run.prepare()
    await run.drive()
    t0 = datetime.fromisoformat(run.state.header.started_at).timestamp()
    records = [
        {
            "ttft_s": r.ttft,
            "start_wall": t0 + r.sent_t,
            "ok": r.status == "ok" and r.ttft is not None,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
        }
        for r in run.state.turns
    ]
    with open(args.out, "w") as f:
        for r in sorted(records, key=lambda r: r["start_wall"]):
            f.write(json.dumps(r) + "\n")
    ok = sum(r["ok"] for r in records)
    print(f"rampwatch peer client: {ok}/{len(records)} ok; recording {cfg.record}", file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model")
    ap.add_argument("--isl", type=int, required=True, help="prompt tokens per request")
    ap.add_argument("--osl", type=int, required=True, help="output tokens per request")
    ap.add_argument("-n", type=int, required=True, help="requests")
    ap.add_argument("-c", type=int, default=1, help="concurrency")
    ap.add_argument("--seed", type=int, default=None, help="unused: every run is salted afresh")
    ap.add_argument("--out", required=True)
    event_loop.run(main(ap.parse_args()))  # the driver's own loop, as `rampwatch run` drives on
