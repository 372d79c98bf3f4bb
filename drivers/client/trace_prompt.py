"""A trace request's prompt from its hash ids: every distinct id becomes a deterministic block of text, so two
requests that share leading ids share exactly that prefix, and the prompt lands on the request's input_length.

Block text is drawn, seeded by (run salt, hash id), from atoms: words that the target server counts as one token
each, and any run of them as many tokens as words (found once through its /tokenize), so a block of N atoms is
exactly N tokens and no two blocks merge at their boundary. A block's text for fewer tokens (a request's partial
last block) is the start of its full text. The chat template's own tokens count where they stand: those before the
message in the first block (its text that much shorter), those after it in the last, so two prompts sharing k
blocks share exactly k blocks' tokens (where the server's /tokenize gives token ids to tell the two apart; else all
of them count in the first block). A server without /tokenize (or whose tokenizer merges the
candidates) gets pseudo-words at a measured characters-per-token ratio: close, not exact. With --corpus the
candidates are the corpus's most common words instead: blocks read as its vocabulary, shuffled, and stay exact.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rampwatch.drivers.client.tokenizer import ServerTokenizer

# Candidates, each with its leading space: common English words (one token in the vocabularies of the models
# served for long contexts) and single letters (one token in nearly any BPE or SentencePiece vocabulary).
CANDIDATES = tuple(
    " " + w
    for w in (
        "the and for are but not you all any can had her was one our out day get has him his how man new now old see "
        "two way who boy did its let put say she too use time that with have this will your from they know want been "
        "good much some very when come here just like long make many more only over such take than them well were "
        "a b c d e f g h i j k l m n o p q r s t u v w x y z"
    ).split()
)
CHECK_ATOMS = 512  # a run this long is counted to check that atoms add up
MIN_ATOMS = 8
CORPUS_CANDIDATES = 300  # a corpus's most common words tried as atoms (each one /tokenize call)
BLOCKS_KEPT = 2048  # block texts kept drawn: a trace's shared system prompts and a session's growing prefix repeat


def corpus_candidates(text: str) -> tuple[str, ...]:
    """A corpus's most common words (letters only, as they stand), each with its leading space; the built-in
    candidates for a corpus with too few such words (a text in another script)."""
    counts = Counter(re.findall(r"[A-Za-z]+", text))
    words = tuple(" " + w for w, _ in counts.most_common(CORPUS_CANDIDATES))
    return words if len(words) >= MIN_ATOMS else CANDIDATES


@dataclass(frozen=True)
class Atoms:
    """The words block text is drawn from; `exact`: each is one token and they add up (else `tokens_per_word`
    estimates them)."""

    words: tuple[str, ...]
    exact: bool = True
    tokens_per_word: float = 1.0


async def find_atoms(tokenizer: ServerTokenizer | None, salt: str, candidates: tuple[str, ...] = CANDIDATES) -> Atoms:
    """The candidates the server counts as one token each, in the largest group (by length) whose random run of
    CHECK_ATOMS words counts CHECK_ATOMS tokens; else every candidate at its measured tokens per word."""
    if tokenizer is None:
        return Atoms(words=candidates, exact=False, tokens_per_word=1.0)
    ones = [w for w in candidates if await tokenizer.text(w) == 1]
    groups: dict[int, list[str]] = {}
    for w in ones:
        groups.setdefault(len(w), []).append(w)
    rng = random.Random(f"{salt}-atoms")
    for group in sorted(groups.values(), key=len, reverse=True):
        if len(group) >= MIN_ATOMS and await tokenizer.text("".join(rng.choices(group, k=CHECK_ATOMS))) == CHECK_ATOMS:
            return Atoms(words=tuple(group))
    counted = await tokenizer.text("".join(rng.choices(candidates, k=CHECK_ATOMS)))
    return Atoms(words=candidates, exact=False, tokens_per_word=(counted or CHECK_ATOMS) / CHECK_ATOMS)


@dataclass(frozen=True)
class Template:
    """What the chat template adds around a user message, in tokens: before it and after it."""

    before: int = 0
    after: int = 0


async def measure_template(tokenizer: ServerTokenizer | None, atoms: Atoms, chat: bool) -> Template:
    """What the server adds to a prompt, before and after its text. A raw prompt (/v1/completions, `chat` false):
    the special tokens (a BOS) a one-atom text counts beyond its atom, all before. A chat message: two one-atom
    prompts' ids agree up to the message (before), and the rest of one of them less its atom is after; without
    ids, every template token is counted before (from an empty message's prompt)."""
    if tokenizer is None:
        return Template()
    if not chat:
        counted = await tokenizer.raw(atoms.words[0])
        return Template(before=max(0, counted - 1) if counted else 0)
    a, b = atoms.words[0], atoms.words[1]
    ids_a, ids_b = await tokenizer.prompt_ids(a), await tokenizer.prompt_ids(b)
    if ids_a is not None and ids_b is not None and atoms.exact:
        before = next((k for k, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
        return Template(before=before, after=max(0, len(ids_a) - before - 1))
    return Template(before=await tokenizer.prompt("") or 0)


class TracePrompts:
    """Prompt text for a trace's requests: blocks of `block_size` tokens, what the server adds to a prompt (its
    template, or a BOS) counted where it stands; `chat`: sent as one chat message (else a raw prompt)."""

    def __init__(self, atoms: Atoms, salt: str, block_size: int, template: Template, chat: bool = False):
        self.atoms, self.salt, self.block_size, self.template, self.chat = atoms, salt, block_size, template, chat
        self.block = functools.lru_cache(maxsize=BLOCKS_KEPT)(self._draw)

    def _draw(self, hash_id: int, tokens: int) -> str:
        """The first `tokens` tokens of block `hash_id`'s text (`block`, the same, kept)."""
        words = max(0, round(tokens / self.atoms.tokens_per_word)) if not self.atoms.exact else tokens
        return "".join(random.Random(f"{self.salt}:{hash_id}").choices(self.atoms.words, k=words))

    def content(self, hash_ids: Sequence[int], input_length: int) -> list[str]:
        """The user message of a prompt of `input_length` tokens (template included) made of `hash_ids`' blocks:
        block k covers the prompt's tokens [k * block_size, (k + 1) * block_size), less the template's before the
        message and after it."""
        size, start = self.block_size, self.template.before
        input_length -= self.template.after
        pieces = []
        for k, hash_id in enumerate(hash_ids):
            lo, hi = max(k * size, start), min((k + 1) * size, input_length)
            if hi > lo:
                pieces.append(self.block(hash_id, hi - lo) if lo == k * size else self._tail(hash_id, lo, hi))
        return pieces

    def _tail(self, hash_id: int, lo: int, hi: int) -> str:
        """Block `hash_id` where the template took its first tokens: the same words from the same draw, less the
        first (lo - its start) ones, so every request sharing the block sends the same text there."""
        skip, n = lo % self.block_size, hi - lo
        if not self.atoms.exact:
            whole = self.block(hash_id, skip + n)
            return whole[len(whole) * skip // (skip + n) :]
        drawn = random.Random(f"{self.salt}:{hash_id}").choices(self.atoms.words, k=skip + n)
        return "".join(drawn[skip:])
