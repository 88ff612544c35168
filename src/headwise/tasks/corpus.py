"""Parallel corpora for translation experiments: a directory of plain text files, one sentence a line,
``{train,dev,test}.{src,tgt}`` (IWSLT14 De-En prepared by fairseq's script fits once renamed); a synthetic
language pair with real structure, written in that layout; and a subword tokenizer trained on a corpus.

The synthetic pair (``SyntheticGrammar``, deterministic from a seed) maps an English-like SVO source to a
target language with other word order and agreement, so a model needs the heads Voita et al. found:

- source ``S V O [PP] .``, target ``S O ko [PP] V .`` (SVO → SOV, object particle ``ko``, verb last);
- noun phrases ``the/a/some ADJ* N`` become ``DET N ADJ*`` (adjectives move after the noun); every noun has a
  hidden gender, and determiner and adjectives agree with it in gender and number;
- the target verb agrees with the subject in number and gender (across the object and the prepositional phrase)
  and marks tense (present/past), which the source marks on the verb;
- ``with NP`` / ``in NP`` become postpositions ``NP sam`` / ``NP ne``;
- names (fresh capitalised syllable strings, mostly unseen in training) and numbers are copied verbatim; a name
  ending in ``a`` is feminine, so the verb's gender comes from the copied name;
- content words are drawn from a Zipf distribution over the lexicon, so the vocabulary has a long rare tail.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..errors import HeadwiseError
from ..io import atomic_write_text, read_text
from ..progress import progress_bar

SPLITS = ("train", "dev", "test")
SIDES = ("src", "tgt")


@dataclass
class ParallelCorpus:
    """Aligned ``source[i]`` ↔ ``target[i]`` sentences of one split."""

    source: list[str]
    target: list[str]

    def __post_init__(self) -> None:
        if len(self.source) != len(self.target):
            raise HeadwiseError(f"a parallel corpus needs as many sources as targets, got {len(self.source)} "
                                f"and {len(self.target)}")

    def __len__(self) -> int:
        return len(self.source)

    def head(self, n: int | None) -> "ParallelCorpus":
        """The first ``n`` pairs (all for ``None``)."""
        return self if n is None else ParallelCorpus(self.source[:n], self.target[:n])


def corpus_file(directory: str | Path, split: str, side: str) -> Path:
    return Path(directory) / f"{split}.{side}"


def read_corpus(directory: str | Path, split: str) -> ParallelCorpus:
    """Read ``<directory>/<split>.src`` and ``.tgt`` (UTF-8, one sentence a line, same number of lines)."""
    if split not in SPLITS:
        raise HeadwiseError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    lines = {}
    for side in SIDES:
        path = corpus_file(directory, split, side)
        if not path.is_file():
            raise HeadwiseError(f"corpus file missing: {path} (a corpus directory holds "
                                f"{', '.join(f'{s}.{x}' for s in SPLITS for x in SIDES)}, one sentence a line)")
        lines[side] = read_text(path).splitlines()
    if len(lines["src"]) != len(lines["tgt"]):
        raise HeadwiseError(f"{corpus_file(directory, split, 'src')} has {len(lines['src'])} lines but "
                            f"{corpus_file(directory, split, 'tgt')} has {len(lines['tgt'])}; they must align")
    return ParallelCorpus(lines["src"], lines["tgt"])


def write_corpus(directory: str | Path, splits: dict[str, ParallelCorpus]) -> Path:
    """Write ``{split}.src`` / ``{split}.tgt`` files into ``directory`` (created); returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, corpus in splits.items():
        for side, lines in (("src", corpus.source), ("tgt", corpus.target)):
            if any("\n" in line for line in lines):
                raise HeadwiseError(f"{split}.{side}: a sentence contains a newline")
            atomic_write_text(corpus_file(directory, split, side), "".join(f"{line}\n" for line in lines))
    return directory


# ---- the synthetic language pair -------------------------------------------------------------------------------

SOURCE_SYLLABLES = [c + v for c in "bdfgklmnprstvw" for v in "aeiou"]
TARGET_SYLLABLES = [c + v for c in "chjqxzrlmn" for v in "aeiuy"]
NAME_SYLLABLES = [c + v for c in "BDGKLMNRSTZ" for v in "aeio"]
GENDERS = ("m", "f")
NUMBERS = ("sg", "pl")
TENSES = ("present", "past")
# target determiner by definiteness, gender, number; target suffixes by gender and number
DETERMINERS = {("def", "m", "sg"): "il", ("def", "f", "sg"): "la", ("def", "m", "pl"): "ilos",
               ("def", "f", "pl"): "las", ("indef", "m", "sg"): "un", ("indef", "f", "sg"): "una",
               ("indef", "m", "pl"): "unos", ("indef", "f", "pl"): "unas"}
ADJ_SUFFIX = {("m", "sg"): "o", ("f", "sg"): "a", ("m", "pl"): "os", ("f", "pl"): "as"}
VERB_SUFFIX = {("present", "m", "sg"): "et", ("present", "f", "sg"): "eta", ("present", "m", "pl"): "en",
               ("present", "f", "pl"): "enas", ("past", "m", "sg"): "it", ("past", "f", "sg"): "ita",
               ("past", "m", "pl"): "in", ("past", "f", "pl"): "inas"}
PLURAL = "en"  # target plural noun suffix
SOURCE_DET = {("def", "sg"): "the", ("def", "pl"): "the", ("indef", "sg"): "a", ("indef", "pl"): "some"}
PREPOSITIONS = {"with": "sam", "in": "ne"}
OBJECT_PARTICLE = "ko"


@dataclass
class Phrase:
    """A noun phrase: a lexicon noun with determiner and adjectives, a name, or a number with a plural noun."""

    kind: str  # "noun", "name" or "number"
    gender: str
    number: str
    noun: int = -1
    adjectives: tuple[int, ...] = ()
    definite: str = "def"
    word: str = ""  # the name or the numeral


@dataclass
class Sentence:
    subject: Phrase
    verb: int
    tense: str
    object: Phrase
    preposition: str | None = None
    complement: Phrase | None = None


@dataclass
class Lexicon:
    """Parallel stems: ``nouns[i] = (source, target, gender)``, ``adjectives[i]``/``verbs[i] = (source, target)``."""

    nouns: list[tuple[str, str, str]]
    adjectives: list[tuple[str, str]]
    verbs: list[tuple[str, str]]


def _words(rng: random.Random, syllables: Sequence[str], count: int, taken: set[str], lengths=(2, 3)) -> list[str]:
    out = []
    while len(out) < count:
        word = "".join(rng.choice(syllables) for _ in range(rng.choice(lengths)))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


@dataclass
class SyntheticGrammar:
    """The synthetic language pair of this module's docstring; ``seed`` fixes the lexicon and the sentences.

    ``zipf``: exponent of the rank-frequency law for content words; ``p_*``: probabilities of the optional parts.
    """

    seed: int = 0
    nouns: int = 400
    adjectives: int = 120
    verbs: int = 80
    zipf: float = 1.0
    p_adjective: float = 0.45
    p_name: float = 0.2
    p_number: float = 0.15
    p_prepositional: float = 0.5
    lexicon: Lexicon = field(init=False)

    def __post_init__(self) -> None:
        rng = random.Random(f"lexicon-{self.seed}")
        reserved = {"the", "a", "some", "with", "in", *DETERMINERS.values(), *PREPOSITIONS.values(), OBJECT_PARTICLE}
        taken_source, taken_target = set(reserved), set(reserved)
        nouns = zip(_words(rng, SOURCE_SYLLABLES, self.nouns, taken_source),
                    _words(rng, TARGET_SYLLABLES, self.nouns, taken_target))
        self.lexicon = Lexicon(
            nouns=[(s, t, rng.choice(GENDERS)) for s, t in nouns],
            adjectives=list(zip(_words(rng, SOURCE_SYLLABLES, self.adjectives, taken_source),
                                _words(rng, TARGET_SYLLABLES, self.adjectives, taken_target))),
            verbs=list(zip(_words(rng, SOURCE_SYLLABLES, self.verbs, taken_source),
                           _words(rng, TARGET_SYLLABLES, self.verbs, taken_target))),
        )
        self._weights = {n: list(accumulate(1.0 / (r + 1) ** self.zipf for r in range(n)))
                         for n in (self.nouns, self.adjectives, self.verbs)}

    def _pick(self, rng: random.Random, n: int) -> int:
        return rng.choices(range(n), cum_weights=self._weights[n])[0]

    def _phrase(self, rng: random.Random, allow_name: bool) -> Phrase:
        u = rng.random()
        if allow_name and u < self.p_name:
            name = "".join(rng.choice(NAME_SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
            return Phrase("name", "f" if name.endswith("a") else "m", "sg", word=name)
        noun = self._pick(rng, self.nouns)
        gender = self.lexicon.nouns[noun][2]
        if u < self.p_name + self.p_number:
            return Phrase("number", gender, "pl", noun=noun, word=str(rng.randint(2, 999)))
        adjectives = []
        while rng.random() < self.p_adjective and len(adjectives) < 3:
            adjectives.append(self._pick(rng, self.adjectives))
        return Phrase("noun", gender, rng.choice(NUMBERS), noun=noun, adjectives=tuple(adjectives),
                      definite=rng.choice(("def", "indef")))

    def sample(self, rng: random.Random) -> Sentence:
        """One random sentence (structure only; ``source`` / ``target`` render it)."""
        has_pp = rng.random() < self.p_prepositional
        return Sentence(subject=self._phrase(rng, True), verb=self._pick(rng, self.verbs), tense=rng.choice(TENSES),
                        object=self._phrase(rng, True),
                        preposition=rng.choice(sorted(PREPOSITIONS)) if has_pp else None,
                        complement=self._phrase(rng, False) if has_pp else None)

    # ---- rendering: words tagged with what they translate, so the alignment comes for free ---------------------
    def _source_phrase(self, p: Phrase, tag: str) -> list[tuple[str, str]]:
        if p.kind == "name":
            return [(p.word, tag)]
        noun = self.lexicon.nouns[p.noun][0] + ("s" if p.number == "pl" else "")
        if p.kind == "number":
            return [(p.word, f"{tag}.num"), (noun, f"{tag}.noun")]
        return [(SOURCE_DET[p.definite, p.number], f"{tag}.det"),
                *((self.lexicon.adjectives[a][0], f"{tag}.adj{i}") for i, a in enumerate(p.adjectives)),
                (noun, f"{tag}.noun")]

    def _target_phrase(self, p: Phrase, tag: str) -> list[tuple[str, str]]:
        if p.kind == "name":
            return [(p.word, tag)]
        noun = self.lexicon.nouns[p.noun][1] + (PLURAL if p.number == "pl" else "")
        if p.kind == "number":
            return [(p.word, f"{tag}.num"), (noun, f"{tag}.noun")]
        suffix = ADJ_SUFFIX[p.gender, p.number]
        return [(DETERMINERS[p.definite, p.gender, p.number], f"{tag}.det"), (noun, f"{tag}.noun"),
                *((self.lexicon.adjectives[a][1] + suffix, f"{tag}.adj{i}") for i, a in enumerate(p.adjectives))]

    def _source_words(self, s: Sentence) -> list[tuple[str, str]]:
        stem = self.lexicon.verbs[s.verb][0]
        verb = stem + "ed" if s.tense == "past" else stem + ("s" if s.subject.number == "sg" else "")
        pp = [(s.preposition, "prep"), *self._source_phrase(s.complement, "pp")] if s.complement else []
        return [*self._source_phrase(s.subject, "subj"), (verb, "verb"), *self._source_phrase(s.object, "obj"),
                *pp, (".", "end")]

    def _target_words(self, s: Sentence) -> list[tuple[str, str | None]]:
        verb = self.lexicon.verbs[s.verb][1] + VERB_SUFFIX[s.tense, s.subject.gender, s.subject.number]
        pp = [*self._target_phrase(s.complement, "pp"), (PREPOSITIONS[s.preposition], "prep")] if s.complement else []
        return [*self._target_phrase(s.subject, "subj"), *self._target_phrase(s.object, "obj"),
                (OBJECT_PARTICLE, None), *pp, (verb, "verb"), (".", "end")]

    def source(self, s: Sentence) -> str:
        return " ".join(w for w, _ in self._source_words(s))

    def target(self, s: Sentence) -> str:
        return " ".join(w for w, _ in self._target_words(s))

    def alignment(self, s: Sentence) -> list[tuple[int, int]]:
        """Word alignment ``(source word, target word)`` of ``source(s)`` / ``target(s)`` (whitespace words); every
        target word but the particle ``ko`` is aligned to exactly one source word."""
        where = {tag: i for i, (_, tag) in enumerate(self._source_words(s))}
        return [(where[tag], j) for j, (_, tag) in enumerate(self._target_words(s)) if tag is not None]

    def sentences(self, split: str, size: int) -> list[Sentence]:
        """The first ``size`` sentences of ``split``; each split has its own random stream, so sizes do not affect
        each other and a prefix of a split is the same at any size."""
        rng = random.Random(f"{split}-{self.seed}")
        return [self.sample(rng) for _ in range(size)]

    def corpus(self, split: str, size: int) -> ParallelCorpus:
        """``size`` rendered pairs of ``split``."""
        sentences = self.sentences(split, size)
        return ParallelCorpus([self.source(s) for s in sentences], [self.target(s) for s in sentences])


def build_synthetic_corpus(directory: str | Path, sizes: dict[str, int] | None = None, seed: int = 0,
                           progress: bool = True) -> Path:
    """Write the synthetic pair (default 50k train, 500 dev, 1000 test pairs) to ``directory``; returns it."""
    sizes = sizes or {"train": 50_000, "dev": 500, "test": 1000}
    grammar = SyntheticGrammar(seed=seed)
    splits = {split: grammar.corpus(split, n)
              for split, n in progress_bar(sizes.items(), desc="synthetic corpus", disable=not progress)}
    return write_corpus(directory, splits)


# ---- subword tokenizer ---------------------------------------------------------------------------------------

SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2000, min_frequency: int = 2, nfkc: bool = False):
    """A joint BPE tokenizer (``PreTrainedTokenizerFast``) over source and target texts; every encoding ends
    with ``</s>``. Metaspace pre-tokenisation keeps decoding reversible, so names and numbers can be copied piece by
    piece and BLEU sees the original spacing. ``nfkc``: NFKC-normalise texts first (real text: ligatures, full-width
    forms). Ids: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(SPECIAL_TOKENS.values())
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    if nfkc:
        tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                                       special_tokens=specials, show_progress=False))
    eos = SPECIAL_TOKENS["eos_token"]
    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A {eos} $B {eos}",
                                                       special_tokens=[(eos, tok.token_to_id(eos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)


def token_alignment(tokenizer: Any, corpus: ParallelCorpus, links: Sequence[Sequence[tuple[int, int]]],
                    max_length: int = 128) -> torch.Tensor:
    """Word alignments (``links[b]``: ``(source word, target word)`` pairs over whitespace words) as subword
    alignments for ``headwise.analysis.head_roles``: ``[B, T, S]`` bool over decoder-input positions × source
    tokens, padded as ``tokenizer`` pads. Decoder position ``i`` is the step that predicts target token ``i``, so it
    is aligned with the source tokens of that token's word. Needs a fast tokenizer (``word_ids``)."""
    src = tokenizer(corpus.source, padding=True, truncation=True, max_length=max_length)
    tgt = tokenizer(text_target=corpus.target, padding=True, truncation=True, max_length=max_length)
    if len(links) != len(corpus):
        raise HeadwiseError(f"{len(links)} alignments for {len(corpus)} sentence pairs")
    out = torch.zeros(len(corpus), len(tgt["input_ids"][0]), len(src["input_ids"][0]), dtype=torch.bool)
    for b, pairs in enumerate(links):
        src_words, tgt_words = src.word_ids(b), tgt.word_ids(b)
        for s_word, t_word in pairs:
            rows = [i for i, w in enumerate(tgt_words) if w == t_word]
            cols = [j for j, w in enumerate(src_words) if w == s_word]
            for i in rows:
                out[b, i, cols] = True
    return out
