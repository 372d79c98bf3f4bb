"""Ramp schedules, salted filler text, the needle, and per-turn token budgeting.

The client never tokenizes the history: it measures a chars-per-token ratio
once through the server's /tokenize and corrects it with each turn's usage
(turn 1, which has none, is counted by the server and fitted before it is sent).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import msgspec

from rampwatch.drivers.client.prompts import Lead

# 32K, 64K, 128K, then +128K a turn to 896K, then 1M: ten turns.
SEED_SCHEDULE: list[int] = [32_768, 65_536] + [131_072 * k for k in range(1, 8)] + [1_000_000]

# Token counts as people write them: k is 1,024 (32k = 32,768) and m is a
# million (1m = 1,000,000), as context lengths are quoted.
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_UNITS = {"": 1, "k": 1024, "m": 1_000_000}

# Rough figures until the server's tokenizer has been asked (see Calibration).
DEFAULT_CHARS_PER_TOKEN = 4.0
DEFAULT_TEMPLATE_TOKENS = 8


class ScheduleError(ValueError):
    """A schedule or size the user typed that cannot be used."""


def parse_tokens(text: str) -> int:
    """'32k' -> 32768, '1m' -> 1000000, '5000' -> 5000."""
    m = _SIZE.match(text)
    if not m:
        raise ScheduleError(f"not a token count: {text!r} (use e.g. 32768, 32k or 1m)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ScheduleError(f"token count must be positive: {text!r}")
    return value


def parse_schedule(text: str) -> list[int]:
    """'seed' or a comma list of growing context sizes."""
    if text.strip().lower() == "seed":
        return list(SEED_SCHEDULE)
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ScheduleError("empty schedule (use 'seed' or e.g. 32k,64k,128k)")
    sizes = [parse_tokens(p) for p in parts]
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ScheduleError(f"schedule must grow turn by turn: {text!r}")
    return sizes


def scale_schedule(schedule: list[int], last: int) -> list[int]:
    """The same shape, with the last turn at `last` tokens."""
    factor = last / schedule[-1]
    scaled = [max(1, round(s * factor)) for s in schedule]
    if any(b <= a for a, b in zip(scaled, scaled[1:])):
        raise ScheduleError(f"--scale-to {last} is too small for a {len(schedule)}-turn ramp")
    return scaled


@functools.cache
def vocabulary(size: int = 4096) -> list[str]:
    """A fixed word list (so one /tokenize calibration fits every session);
    the salt decides the order words are drawn in."""
    rng = random.Random(0)
    # Pronounceable pseudo-words: tokenizers split them like rare English words,
    # and a salted draw from a large vocabulary never repeats a block.
    onsets = [
        "b",
        "br",
        "c",
        "ch",
        "d",
        "f",
        "g",
        "gr",
        "h",
        "k",
        "l",
        "m",
        "n",
        "p",
        "pl",
        "r",
        "s",
        "st",
        "t",
        "tr",
        "v",
        "w",
        "z",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    words: set[str] = set()
    while len(words) < size:
        syllables = rng.randint(1, 3)
        words.add("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syllables)))
    return sorted(words)


class Needle:
    """A salted fact planted in turn 1 and asked for at the end of every turn."""

    def __init__(self, rng: random.Random):
        first = rng.choice(["Marlow", "Ilsa", "Tobin", "Reya", "Caspian", "Odile", "Bram", "Sunniva"])
        last = "".join(rng.choice(string.ascii_uppercase) + rng.choice("aeiou") for _ in range(3)).capitalize()
        self.key = f"{first} {last}"
        code = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))
        self.value = f"{code[:4]}-{code[4:]}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.value.encode()).hexdigest()

    def fact(self) -> str:
        return f"Remember this fact: the access code of {self.key} is {self.value}."

    def question(self) -> str:
        return f"Question: what is the access code of {self.key}? Answer with the code only."

    def found_in(self, reply: str) -> bool:
        return self.value.lower() in reply.lower()


class TextSource(Protocol):
    """Where a conversation's new text comes from: pseudo-words (Filler) or a corpus (CorpusReader)."""

    def text(self, chars: int) -> str: ...
    def where(self) -> list[int]: ...
    def go_to(self, where: list[int]) -> None: ...


class Filler:
    """Endless salted text: a fresh random draw of words, never a repeated block."""

    def __init__(self, rng: random.Random):
        self._rng = rng
        self._words = vocabulary()

    def text(self, chars: int) -> str:
        if chars <= 0:
            return ""
        # Average word length + space is about 7 characters; overshoot, then trim.
        words = self._rng.choices(self._words, k=chars // 6 + 8)
        out = " ".join(words)
        while len(out) < chars:
            out += " " + " ".join(self._rng.choices(self._words, k=64))
        cut = out.rfind(" ", 0, chars)
        return out[: cut if cut > 0 else chars]

    def where(self) -> list[int]:
        """Where its draw has got to (the generator's state), to go on from elsewhere (go_to)."""
        return list(self._rng.getstate()[1])

    def go_to(self, where: list[int]) -> None:
        self._rng.setstate((3, tuple(where), None))  # version 3: CPython's Mersenne Twister state


@dataclass(frozen=True)
class Calibration:
    """What one round of /tokenize calls told us about the server's tokenizer."""

    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    template_tokens: int = DEFAULT_TEMPLATE_TOKENS  # chat-template tokens around one user message
    fixed_tokens: tuple[int, int] | None = (
        None  # tokens of (turn 1's, later turns') fixed text, for the probe's session
    )
    tokenize_field: str | None = None  # the text field /tokenize takes (prompt; llama.cpp: content); None: no /tokenize
    special_tokens: int = 0  # what /tokenize adds to any text (a BOS): not part of the text's own count


# A turn's new text longer than this (~64K tokens) lands within ~0.2% as drawn; up to it, the server counts it
# and its filler is fitted (Conversation.fit_turn).
FIT_MAX_CHARS = 262_144


class ConversationState(msgspec.Struct, kw_only=True):
    """What a conversation has learnt and where its text has got to after a turn: with the session's history,
    all a replacement worker needs to go on with it (--workers-restart)."""

    chars_per_token: float
    fixed_measured: tuple[int, int] | None
    last_prompt_tokens: int | None
    last_reply_tokens: int
    source: list[int]  # its TextSource's place (where())


class Conversation:
    """One growing conversation: what to send each turn so the server's
    prompt_tokens lands on the schedule, from usage feedback alone.

    It keeps no history text: the session keeps the encoded messages, and
    this class keeps the counts it budgets with."""

    PIECE_CHARS = 65_536  # one slice of filler; the event loop breathes between slices

    def __init__(
        self,
        salt: str,
        schedule: list[int],
        calibration: Calibration | None = None,
        lead: Lead | None = None,
        source: TextSource | None = None,
    ):
        """`lead`: what every session of the run opens with; `source`: the new text (default: salted
        pseudo-words)."""
        rng = random.Random(salt)
        cal = calibration or Calibration()
        self.salt = salt
        self.lead = lead or Lead()
        self.schedule = schedule
        self.chars_per_token = cal.chars_per_token
        self.template_tokens = cal.template_tokens
        self._fixed_measured = cal.fixed_tokens
        self.tokenize_field = cal.tokenize_field
        self.special_tokens = cal.special_tokens
        self.needle = Needle(rng)
        self.filler: TextSource = source if source is not None else Filler(rng)
        self.last_prompt_tokens: int | None = None  # the previous turn's reported prompt
        self.last_reply_tokens = 0
        self._pending: tuple[int, int] | None = None  # (turn, filler chars) awaiting usage

    def fixed_text(self, turn: int) -> str:
        """The non-filler text of a turn's message: salt and fact (turn 1), and the question."""
        lead = f"[{self.salt}] \n{self.needle.fact()}\n" if turn == 1 else ""
        return lead + f"\n\n{self.needle.question()}"

    def measured_fixed(self, first: int, later: int) -> None:
        """This session's own fixed text as the server counts it: its salt and needle's
        name tokenize differently from the probe's, which turn 1 has no usage to correct."""
        self._fixed_measured = (first, later)

    def _fixed_tokens(self, turn: int) -> int:
        """The turn's tokens that are not its new text: salt, fact and question, and on turn 1 the lead."""
        lead = self.lead.tokens if turn == 1 else 0
        if self._fixed_measured is not None:
            return lead + self._fixed_measured[0 if turn == 1 else 1]
        return lead + round(len(self.fixed_text(turn)) / self.chars_per_token)

    def plan(self, turn: int) -> tuple[int, int]:
        """(filler characters, tokens the new message adds) for turn `turn`."""
        target = self.schedule[turn - 1]
        if self.last_prompt_tokens is None:
            new_tokens = target  # first turn: everything is new
        else:
            new_tokens = target - self.last_prompt_tokens - self.last_reply_tokens
        filler_tokens = new_tokens - self.template_tokens - self._fixed_tokens(turn)
        return max(0, int(filler_tokens * self.chars_per_token)), max(1, new_tokens)

    def user_message(self, turn: int, filler_chars: int) -> Iterator[str]:
        """The user message of `turn` in slices: filler (with the needle's fact
        in the middle of turn 1), then the question."""
        written = 0

        def filler(chars: int) -> Iterator[str]:
            nonlocal written
            while chars > 0:
                piece = self.filler.text(min(chars, self.PIECE_CHARS))
                if not piece:
                    return
                chars -= len(piece) + 1
                written += len(piece) + 1
                yield piece + " "

        if turn == 1:
            half = filler_chars // 2
            # The salt leads (after the run's shared lead), so no two runs or sessions share more.
            if self.lead.shared:
                yield self.lead.opening()
            yield f"[{self.salt}] "
            yield from filler(half)
            yield f"\n{self.needle.fact()}\n"
            yield from filler(filler_chars - half)
        else:
            yield from filler(filler_chars)
        yield f"\n\n{self.needle.question()}"
        self._pending = (turn, written)

    def fit_goal(self, turn: int) -> int:
        """What fit_turn brings turn `turn`'s count to: turn 1 is counted as the whole prompt (its lead and
        chat template in it), a later turn as its new message's own text."""
        _, new_tokens = self.plan(turn)
        return new_tokens if turn == 1 else new_tokens - self.template_tokens

    def fits(self, turn: int) -> bool:
        """Whether turn `turn` is counted by the server and fitted before it goes: turn 1 always (it has no
        usage to correct it), later turns when their text is a corpus's, whose density varies from one
        stretch to the next (pseudo-words' does not: usage alone lands them)."""
        return turn == 1 or not isinstance(self.filler, Filler)

    def fit_rounds(self) -> int:
        """How many times a turn is counted and fitted: once for pseudo-words (their density is even), twice for a
        corpus, whose stretch a fit adds or cuts has a density of its own (code's indentation against its
        symbols: one count and fit left a turn of drivers/ 2.1% short against vLLM's tokenizer)."""
        return 1 if isinstance(self.filler, Filler) else 2

    def fit_turn(self, turn: int, pieces: list[str], tokens: int) -> list[str]:
        """A few hundred words drawn at random (or a stretch of a corpus) miss the plan by up to 2-3% (more).
        Given turn `turn`'s message (the pieces of user_message(turn, ...)) and `tokens`, its count as the
        server makes it (see fit_goal): the message with its filler (turn 1: between the fact and the
        question) extended or trimmed by the difference."""
        fact = f"\n{self.needle.fact()}\n"
        if self._pending is None or self._pending[0] != turn or (turn == 1 and fact not in pieces):
            return pieces
        chars = round((self.fit_goal(turn) - tokens) * self.chars_per_token)
        at = pieces.index(fact) + 1 if turn == 1 else 0
        rest = "".join(pieces[at:-1])
        # Cut to the character, not to a word: a whole word is ~1% of a few hundred tokens on a byte-level vocabulary.
        if chars > 0:
            fitted = rest + self.filler.text(chars + 32)[:chars]  # Filler.text() ends on a word, up to one word short
        else:
            fitted = rest[: max(0, len(rest) + chars)]
        self._pending = (turn, self._pending[1] + len(fitted) - len(rest))
        return [*pieces[:at], fitted, pieces[-1]]

    def add_reply(self, prompt_tokens: int | None, completion_tokens: int, resent_tokens: int | None = None) -> None:
        """Fold the server's usage for the turn just finished into the budget. `resent_tokens`:
        the reply counted as text, as the next turn re-sends it (a small model's stray bytes can
        re-tokenize to half again its completion tokens); else its completion tokens."""
        if prompt_tokens is not None and self._pending is not None:
            turn, filler_chars = self._pending
            before = 0 if self.last_prompt_tokens is None else self.last_prompt_tokens + self.last_reply_tokens
            added = prompt_tokens - before - self.template_tokens - self._fixed_tokens(turn)
            if added > 64 and filler_chars > 256:
                self.chars_per_token = filler_chars / added
        if prompt_tokens is not None:
            self.last_prompt_tokens = prompt_tokens
        self.last_reply_tokens = resent_tokens if resent_tokens is not None else completion_tokens
        self._pending = None

    def state(self) -> ConversationState:
        return ConversationState(
            chars_per_token=self.chars_per_token,
            fixed_measured=self._fixed_measured,
            last_prompt_tokens=self.last_prompt_tokens,
            last_reply_tokens=self.last_reply_tokens,
            source=self.filler.where(),
        )

    def skip(self, turn: int) -> None:
        """Draw turn `turn`'s new text as it would be sent, and drop it: the text source moves past it."""
        filler_chars, _ = self.plan(turn)
        for _ in self.user_message(turn, filler_chars):
            pass
        self._pending = None

    def resume(self, state: ConversationState) -> None:
        """Go on from `state` (another process's copy of this conversation, state() after a turn)."""
        self.chars_per_token, self._fixed_measured = state.chars_per_token, state.fixed_measured
        self.last_prompt_tokens, self.last_reply_tokens = state.last_prompt_tokens, state.last_reply_tokens
        self.filler.go_to(state.source)
        self._pending = None
