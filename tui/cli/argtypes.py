"""Argument types: each turns one command-line word into a value or a one-line argparse error."""

from __future__ import annotations

import argparse

from rampwatch.drivers.run.config import BadInput, parse_duration


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except BadInput as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return v


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


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
