"""Argument types: each turns one command-line word into a value or a one-line argparse error."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from rampwatch.drivers.run.config import BadInput, parse_duration

N = TypeVar("N", int, float)


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except BadInput as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _at_least(text: str, parse: Callable[[str], N], what: str, least: N, rule: str) -> N:
    """`text` parsed as `what`, refused with `rule` below `least`."""
    try:
        v = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"{rule}: {text!r}")
    return v


def positive_float(text: str) -> float:
    return _at_least(text, float, "a number", 0.0, "must not be negative")


def positive_int(text: str) -> int:
    return _at_least(text, int, "a whole number", 1, "must be at least 1")


def share(text: str) -> float:
    """'95%' or '0.95' -> 0.95, a share above 0 and at most 1."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a share: {text!r} (e.g. 95% or 0.95)") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"a share is above 0 and at most 100%: {text!r}")
    return v


def speed(text: str) -> float:
    """'2' or '0.5x' -> a factor above 0."""
    try:
        v = float(text.strip().removesuffix("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a speed: {text!r} (e.g. 2 or 0.5x)") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"a speed is above 0: {text!r}")
    return v


def speeds(text: str) -> list[float]:
    """'0.5,1,2,4' -> growing speeds, each above 0."""
    values = [speed(x) for x in text.split(",") if x.strip()]
    if not values or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"speeds must be growing numbers above 0: {text!r} (e.g. 0.5,1,2,4)")
    return values


def session_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of session counts: {text!r} (e.g. 1,2,4,8)") from None
    if not counts or any(c < 1 for c in counts) or counts != sorted(set(counts)):
        raise argparse.ArgumentTypeError(f"session counts must be growing whole numbers >= 1: {text!r}")
    return counts


def topology(text: str) -> str:
    # Imported here: the simulator (and its web stack) loads only for the commands that start one.
    from rampwatch.drivers.sim.topology import Topology

    try:
        Topology.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
