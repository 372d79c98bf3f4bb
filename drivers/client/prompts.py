"""What a conversation is made of besides its salted pseudo-words: real text read from files (--corpus), and
the lead every session of a run shares (--system-prompt, --shared-prefix) before its own salt."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

CORPUS_MAX_CHARS = 64 << 20  # ~16M tokens: more than a 1M ramp of several sessions reads before wrapping
SNIFF_BYTES = 8192  # a NUL in a file's first bytes marks it binary


class CorpusError(ValueError):
    """A --corpus path that gives no text."""


@dataclass(frozen=True)
class Corpus:
    """The text files under a path, read once, in sorted order (the same path reads the same in every run),
    joined by blank lines."""

    path: str
    text: str
    files: int

    @property
    def sha256(self) -> str:
        return text_sha256(self.text)

    def sample(self, chars: int, slices: int = 10) -> str:
        """`chars` characters from `slices` places spread over the corpus: what its text averages to per
        token (code and prose tokenize differently, and a corpus may hold both)."""
        step = max(1, len(self.text) // slices)
        each = max(1, chars // slices)
        return "".join(CorpusReader(self, k * step).text(each) for k in range(slices))


def corpus_files(path: Path) -> list[Path]:
    """The files a --corpus path names: itself, or every file under it (hidden ones and folders skipped),
    sorted."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def read_corpus(path: Path) -> Corpus:
    """The corpus at `path`: its UTF-8 text files (binary and undecodable ones skipped), up to
    CORPUS_MAX_CHARS. CorpusError when there is none."""
    if not path.exists():
        raise CorpusError(f"--corpus {path}: no such file or directory")
    texts: list[str] = []
    size = 0
    for f in corpus_files(path):
        limit = (CORPUS_MAX_CHARS - size) * 4  # UTF-8 takes at most 4 bytes a character: never a whole huge file
        try:
            with f.open("rb") as stream:
                data = stream.read(limit)
        except OSError:
            continue
        if b"\0" in data[:SNIFF_BYTES]:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            if len(data) < limit or e.start < len(data) - 3:
                continue  # not UTF-8 text
            text = data[: e.start].decode("utf-8")  # a character cut at the limit
        if not text.strip():
            continue
        texts.append(text)
        size += len(text)
        if size >= CORPUS_MAX_CHARS:
            break
    if not texts:
        raise CorpusError(f"--corpus {path}: no text files in it (binary and non-UTF-8 files are skipped)")
    return Corpus(path=str(path), text="\n\n".join(texts)[:CORPUS_MAX_CHARS], files=len(texts))


class CorpusReader:
    """A corpus read on from one offset, wrapping at its end: one session's new text (the same `text(chars)`
    as the pseudo-word Filler)."""

    def __init__(self, corpus: Corpus, offset: int):
        self.corpus = corpus
        self.at = offset % len(corpus.text)

    def text(self, chars: int) -> str:
        src = self.corpus.text
        out: list[str] = []
        while chars > 0:
            piece = src[self.at : self.at + chars]
            out.append(piece)
            chars -= len(piece)
            self.at = (self.at + len(piece)) % len(src)
        return "".join(out)

    def where(self) -> list[int]:
        return [self.at]

    def go_to(self, where: list[int]) -> None:
        self.at = where[0] % len(self.corpus.text)


@dataclass(frozen=True)
class Lead:
    """What opens every session's prompt in a run: the system message, then a shared block at the head of
    the first user message, before the session's own salt (so sessions share exactly this much)."""

    system: str | None = None
    shared: str = ""
    tokens: int = 0  # what both add to turn 1's prompt, as the server counts them
    shared_tokens: int | None = None  # the shared block's own size as the server counts it (None: not counted)

    def opening(self) -> str:
        """The first user message's shared head."""
        return self.shared + "\n" if self.shared else ""


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
