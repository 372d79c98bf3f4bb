"""The flags that shape the traffic of run, demo and sweep: the ramp, what each request carries, and how the
prompts are made."""

from __future__ import annotations

import argparse
from pathlib import Path

from rampwatch.tui.cli.argtypes import duration, positive_float, positive_int, session_counts
from rampwatch.tui.cli.spec.workers import add_worker_args


def add_ramp_args(
    p: argparse.ArgumentParser, sessions_default: int = 1, lockstep_default: bool = False, sweep: bool = False
) -> None:
    p.add_argument("--model", help="model to ask for (default: the first of /v1/models)")
    if sweep:
        p.add_argument(
            "--sessions",
            type=session_counts,
            metavar="N,N,...",
            help="closed loop: session counts to run, in lockstep, one after the other (e.g. 1,2,4,8); with "
            "--arrivals or --find-max one N: at most N conversations a point (default: as many as arrive)",
        )
    else:
        p.add_argument(
            "--sessions",
            type=positive_int,
            default=sessions_default,
            metavar="N",
            help=f"conversations to run at once (default {sessions_default})",
        )
    p.add_argument(
        "--stagger",
        type=positive_float,
        default=0.0,
        metavar="S",
        help="seconds between the starts of consecutive sessions (default 0)",
    )
    p.add_argument(
        "--schedule",
        default="seed",
        metavar="seed|LIST",
        help="context tokens per turn: 'seed' (32k,64k,128k,+128k…,1m) or a list like 32k,64k,128k",
    )
    p.add_argument(
        "--scale-to",
        metavar="TOKENS",
        help="same shape, last turn at TOKENS (for servers with a shorter max context), e.g. 32k",
    )
    add_request_args(p)
    p.add_argument("--retries", type=int, default=0, metavar="N", help="retry a failed turn N times (default 0)")
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=3600.0,
        metavar="S",
        help="longest wait for a turn, prefill included (default 3600)",
    )
    p.add_argument(
        "--reconnect-timeout",
        type=positive_float,
        default=180.0,
        metavar="S",
        help="how long sessions wait for a vanished server to come back (default 180)",
    )
    p.add_argument(
        "--record-text",
        action="store_true",
        help="keep prompt and reply text in the recording (default: sizes, salts and hashes only)",
    )
    p.add_argument(
        "--lockstep",
        action=argparse.BooleanOptionalAction,
        default=lockstep_default,
        help="turn k+1 of any session starts only when turn k of every live session has finished "
        f"(default {'on' if lockstep_default else 'off'})",
    )
    p.add_argument(
        "--one-shot",
        action="store_true",
        help="after the ramp, send one fresh prompt as long as its last turn (unshared salt: no cache hit) "
        "as a baseline; with a one-turn --schedule, only that prompt",
    )
    p.add_argument(
        "--strict-needle",
        action="store_true",
        help="re-send replies with the needle's code masked, so the only copy stays in turn 1 "
        "(default: replies go back verbatim, as in a real conversation)",
    )
    p.add_argument(
        "--time-limit",
        type=duration,
        metavar="DURATION",
        help="start no new turn after this long, e.g. 40s, 90m, 2h (the run ends with status time-limit)",
    )
    p.add_argument(
        "--grace",
        type=positive_float,
        default=0.0,
        metavar="S",
        help="with --time-limit: cancel turns still in flight S seconds after the limit (default 0: let them finish)",
    )
    add_prompt_shape_args(p)
    add_worker_args(p)


def add_request_args(p: argparse.ArgumentParser) -> None:
    """What each chat request asks for and carries besides the conversation."""
    p.add_argument(
        "--output-tokens",
        type=positive_int,
        default=128,
        metavar="N",
        help="the answer each turn asks for (default 128): the request's max_tokens unless --max-tokens is given; "
        "either way at most N tokens of the answer go back into the history",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        metavar="N",
        help="cap on all a turn generates, reasoning and answer together, sent as max_tokens (default: "
        "--output-tokens, the answer budget, which the history still keeps to); e.g. 4096 for a model that thinks",
    )
    p.add_argument(
        "--reasoning",
        choices=("off", "on", "auto"),
        default="auto",
        help="thinking of reasoning models: off or on sends chat_template_kwargs enable_thinking and thinking "
        "false or true (Qwen3, DeepSeek V3.1, GLM templates); auto sends nothing, the server's default (default)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask the server to generate exactly --output-tokens, or --max-tokens when given (ignore_eos / min_tokens)",
    )
    p.add_argument(
        "--extra-body",
        metavar="JSON|@FILE",
        help="request options merged into every chat request, e.g. '{\"top_k\": 20}' or "
        '\'{"chat_template_kwargs": {"enable_thinking": false}}\' (keys rampwatch sets itself are refused)',
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an HTTP header for the inference servers, repeatable; {session}, {turn} and {run} are filled in "
        "per request, e.g. 'x-session-id: {session}' for a router's session affinity (credential headers are "
        "never recorded or printed)",
    )


def add_prompt_shape_args(p: argparse.ArgumentParser) -> None:
    """How the prompts are made: a shared lead, real text, the user's pauses."""
    p.add_argument(
        "--system-prompt",
        metavar="TEXT|@FILE",
        help="a system message every session opens with (the same text: sessions share its prefix), "
        "e.g. @prompts/system.txt",
    )
    p.add_argument(
        "--shared-prefix",
        metavar="TOKENS",
        help="a block of TOKENS tokens every session of the run shares, after the system prompt and before "
        "its own salt, e.g. 8k (counted in each turn's target)",
    )
    p.add_argument(
        "--corpus",
        type=Path,
        metavar="PATH",
        help="read the conversations' new text from this file or directory of text or code files (read "
        "recursively, sorted; binary files skipped; each session starts at its own place, wrapping at the end) "
        "instead of pseudo-words; with --trace, each hash-id block is drawn from this text's words",
    )
    p.add_argument(
        "--think-time",
        metavar="S|A..B",
        help="the user's pause between a reply and the next turn, e.g. 10s, or drawn uniformly from a range "
        "like 5s..30s or 0s..30s (seeded by the run's salt; 0s: no pause); with --lockstep the barrier first, "
        "then each session's pause; in a demo, modelled time like every other",
    )
