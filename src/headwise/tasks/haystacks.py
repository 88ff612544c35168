"""The long-context suite's haystacks: where the text around a sample's needles comes from, each with its licence,
all available offline (``HAYSTACKS``):

- ``generated``: sentences generated from the word lists of ``tasks.long_words`` (the suite's first haystack;
  headwise's own, the project's licence);
- ``prose``: natural prose, the last 10% of WikiText-2's validation split shipped in the package
  (``headwise/data/prose``, CC BY-SA 3.0), which ``kv-policy`` never calibrates on;
- ``docs``: the prose of Python's own documentation, ``pydoc_data.topics`` (every Python install has it; PSF
  License), its topics in sorted order;
- ``code``: the source lines of a fixed list of Python standard-library modules (``kvcache.natural.CODE_MODULES``,
  read from this interpreter's library; PSF License), non-blank lines in order (docs and code: the text
  ``kvcache.natural`` reads, which ``kv_policy`` calibrates the ``outside`` score on);
- a FILE: the sentences of the user's UTF-8 text file.

A haystack is a stream of whole units (sentences, or lines of code) read from a seeded offset and wrapped around;
a needle goes between two units, followed by ``Haystack.end`` (a space after a sentence, a newline among lines of
code), so a unit is never cut and the needle stays a string the scorer finds."""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import HeadwiseError
from ..kvcache.natural import SOURCES, source_text, source_version
from .long_words import ADJECTIVES, MONTHS, NOUNS, PEOPLE, VERBS
from .paths import PACKAGED_DATA

PROSE_FILE = PACKAGED_DATA / "prose" / "wikitext-2-valid-tail.txt"
HAYSTACKS = {
    "generated": "headwise's own word lists (headwise.tasks.long_words), the project's licence",
    "prose": "WikiText-2 validation split, its last 10% (headwise/data/prose), CC BY-SA 3.0",
    **SOURCES,
}
MIN_UNITS = 8
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def generated_sentence(rng: random.Random) -> str:
    """One sentence of the generated haystack (plain prose from ``long_words``)."""
    n1, n2, n3 = rng.choice(NOUNS), rng.choice(NOUNS), rng.choice(NOUNS)
    a1, a2 = rng.choice(ADJECTIVES), rng.choice(ADJECTIVES)
    v, p, m = rng.choice(VERBS), rng.choice(PEOPLE), rng.choice(MONTHS)
    forms = (f"The {a1} {p} {v} the {n1} near the {n2}.",
             f"In {m}, the {n1} by the {n2} looked {a1} and {a2}.",
             f"Nobody expected the {a1} {n1} to stand so close to the old {n2}.",
             f"Every {p} in the {n1} knew the story of the {a2} {n2}.",
             f"After the {n1} was {v}, the {p} walked to the {a1} {n2}.",
             f"Some said the {n1} had been {a1} long before the {n2} and the {n3} were there.",
             f"A {a1} {n1} and a {a2} {n2} were all the {p} {v} that day.",
             f"By {m} the {p} had {v} the {n1}, the {n2} and the {n3}.")
    return rng.choice(forms) + " "


def text_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (split after ``.``, ``!``, ``?``), each ending in a space."""
    units = [u.strip() for line in text.splitlines() for u in SENTENCE_END.split(line)]
    return [u + " " for u in units if u]


def code_lines(text: str) -> list[str]:
    """The non-blank lines of source ``text``, each ending in a newline (indentation kept)."""
    return [line.rstrip() + "\n" for line in text.splitlines() if line.strip()]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Haystack:
    """A haystack (see the module docstring): its ``name`` (one of ``HAYSTACKS``, or the FILE as given), its
    ``units`` (empty: generated), ``source`` (where they come from, with a digest of the text) and ``licence``, and
    ``end``, what follows a needle placed between two units."""

    name: str = "generated"
    sentences: tuple[str, ...] = ()
    source: str = "generated (headwise.tasks.long_data: sentences from the long_words lists)"
    licence: str = HAYSTACKS["generated"]
    end: str = " "

    @classmethod
    def of(cls, name: str | Path | None, option: str = "--haystack") -> "Haystack":
        """The haystack ``name`` (None: ``generated``), or the sentences of the UTF-8 text file ``name``; an unknown
        name that is not a file, or a file of fewer than 8 sentences, is refused in one line naming ``option``."""
        if name is None or name == "generated":
            return cls()
        if name == "prose":
            return cls._text("prose", PROSE_FILE.read_text(encoding="utf-8"), text_sentences,
                             "headwise/data/prose/wikitext-2-valid-tail.txt")
        if name == "docs":
            return cls._text("docs", source_text("docs"), text_sentences, f"pydoc_data.topics of Python "
                             f"{source_version()}")
        if name == "code":
            return cls._text("code", source_text("code"), code_lines, f"standard library of Python "
                             f"{source_version()}", "\n")
        return cls.file(name, option)

    @classmethod
    def _text(cls, name: str, text: str, split, where: str, end: str = " ") -> "Haystack":
        units = split(text)
        return cls(name, tuple(units), f"{name}: {where} (sha256 {_digest(text)}…, {len(units)} units)",
                   HAYSTACKS[name], end)

    @classmethod
    def file(cls, data: str | Path, option: str = "--haystack") -> "Haystack":
        """The sentences of the UTF-8 text file ``data`` (the user's own haystack)."""
        from ..io.files import read_text

        path = Path(data).expanduser()
        if not path.is_file():
            raise HeadwiseError(f"{option} {data}: no such file, and not a haystack name; give one of "
                                f"{', '.join(HAYSTACKS)} or a UTF-8 text file")
        text = read_text(path)
        sentences = text_sentences(text)
        if len(sentences) < MIN_UNITS:
            raise HeadwiseError(f"{option} {data}: {len(sentences)} sentence(s); the haystack needs running text of "
                                f"at least {MIN_UNITS} sentences")
        return cls(str(data), tuple(sentences), f"{path} (sha256 {_digest(text)}…, {len(sentences)} sentences)",
                   "the user's file (its own licence)")

    def units(self, rng: random.Random) -> Iterator[str]:
        """An endless stream of units: generated sentences, or the text's from a seeded offset, wrapped around."""
        if not self.sentences:
            while True:
                yield generated_sentence(rng)
        at = rng.randrange(len(self.sentences))
        while True:
            yield self.sentences[at % len(self.sentences)]
            at += 1


def parse_haystacks(text: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """``"prose,docs"`` → ``("prose", "docs")`` (None: ``("generated",)``); names repeated are refused."""
    names = ("generated",) if text is None else tuple(p.strip() for p in text.split(",")) \
        if isinstance(text, str) else tuple(text)
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        raise HeadwiseError(f"--haystack {text!r}: give distinct haystacks, comma-separated, from "
                            f"{', '.join(HAYSTACKS)} or a FILE")
    return names
