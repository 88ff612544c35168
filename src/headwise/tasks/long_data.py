"""The long-context suite's samples and scorer: RULER-style task families generated from a seed, a target length
in tokens of the model's own tokenizer and a haystack, with nothing downloaded.

Each sample is one context and one or more questions about it, tokenised apart (the context once, then each
question with the answer's first words), so that a runner prefills the context once and asks every question
after it (``tasks.long``). Tasks (``TASKS``) and their families (``FAMILIES``):

- ``niah_single`` (retrieval): one needle ``One hidden value for KEY is: VALUE.`` (a 7-digit number) in the
  haystack at a depth spread over the samples; one question.
- ``niah_multi`` (retrieval): four keys, each the others' distractor, their values numbers, words and UUIDs in
  turn, one key (not a UUID's) with two values; the five needles at spread depths; one question per key.
- ``vt`` (multi-hop tracing): two chains ``VAR A = 12345.``, ``VAR B = VAR A.``, … of four hops each in the
  haystack; one question per chain: every variable that holds its value (five names).
- ``cwe`` (aggregation): a numbered list of words in which five words occur six times as often as the others;
  the five.
- ``fwe`` (aggregation): coded words drawn from a Zipf law (exponent 2); the three most frequent.
- ``qa`` (question answering): six facts ``NAME, a JOB, lives in CITY.`` in the haystack; one question per person
  for four of them: the city.

The haystack is one of ``tasks.haystacks.HAYSTACKS`` (``generated`` by default: sentences from the word lists of
``tasks.long_words``; ``prose``, ``docs``, ``code``) or the user's FILE, its units read from a seeded offset; a
needle goes between two units, followed by the haystack's ``end``. Lengths count the whole
prompt: context + the longest question + the tokens its answer may take (``Question.max_new``) fit the target.

A tokenizer with a chat template gets the context inside a user turn and each question closing it, the assistant
turn opened with the answer's first words; one without a template gets plain text (``frame``).

Scoring as RULER does: the share of expected strings found in the answer, case-insensitively (``match="all"``),
or 1 when any of the accepted strings is found (``match="any"``). Every string is drawn from
``random.Random(f"{seed}/{task}/{length}/{index}")``: a sample is the same whatever else is drawn.
"""

from __future__ import annotations

import math
import random
import re
import string
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from ..errors import HeadwiseError
from .haystacks import Haystack
from .long_words import ADJECTIVES, CITIES, FIRST_NAMES, LAST_NAMES, NOUNS, PEOPLE, VERBS

FAMILIES = {"niah_single": "retrieval", "niah_multi": "retrieval", "vt": "multi-hop", "cwe": "aggregation",
            "fwe": "aggregation", "qa": "qa"}
TASKS = tuple(FAMILIES)
SEED = 4949  # the suite's default seed (kv-policy calibration draws from other seeds, a passkey format and filler)
SLACK = 8  # answer tokens beyond the expected strings' own
MIN_LENGTH = 256
MAX_LENGTH = 1 << 20
GOLDEN = (math.sqrt(5) - 1) / 2  # depths of successive samples: a low-discrepancy sequence over [0, 1)
MARK = "\x00"
CONTROL = re.compile(r"[\x00-\x1f]")


@dataclass(frozen=True)
class Question:
    """One question about a sample's context: ``ids`` (the question, the end of the user turn and the answer's
    first words), the strings the answer must hold (``expected``; ``match`` ``"all"``: the share found, ``"any"``:
    one of them suffices), the most tokens the answer may take, and ``tag`` (what it probes: a value kind, a
    depth)."""

    ids: tuple[int, ...]
    expected: tuple[str, ...]
    max_new: int
    match: str = "all"
    tag: str = ""


@dataclass(frozen=True)
class Sample:
    """One context (``context_ids``, the prompt's start) and its questions, for ``task`` at ``length`` tokens."""

    task: str
    length: int
    index: int
    context_ids: tuple[int, ...]
    questions: tuple[Question, ...]

    @property
    def key(self) -> str:
        return f"{self.task}/{self.length}/{self.index}"

    @property
    def tokens(self) -> int:
        """The longest prompt plus its answer budget (≤ ``length``)."""
        return len(self.context_ids) + max(len(q.ids) + q.max_new for q in self.questions)


def score_answer(answer: str, expected: Sequence[str], match: str = "all") -> float:
    """RULER's string match in [0, 1]: the share of ``expected`` found in ``answer`` (``"all"``) or whether any is
    (``"any"``), case-insensitive, control characters removed."""
    if match not in ("all", "any"):
        raise HeadwiseError(f"match={match!r}: use 'all' or 'any'")
    if not expected:
        raise HeadwiseError("a question needs at least one expected string")
    text = CONTROL.sub("", answer).strip().lower()
    found = [e.lower() in text for e in expected]
    return sum(found) / len(found) if match == "all" else float(any(found))


# ---- lengths and haystacks ------------------------------------------------------------------------------------

def parse_lengths(text: str | Sequence[int]) -> tuple[int, ...]:
    """``"2k,4k"`` or ``"2048,4096"`` (``k`` = 1024) → ``(2048, 4096)``; refused in one line unless each is an
    integer number of tokens in ``MIN_LENGTH .. MAX_LENGTH``."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    lengths = []
    for part in parts:
        try:
            value = int(part[:-1]) * 1024 if isinstance(part, str) and part.lower().endswith("k") else int(part)
        except ValueError:
            value = None
        if value is None or isinstance(part, bool) or not MIN_LENGTH <= value <= MAX_LENGTH:
            raise HeadwiseError(f"--lengths {text!r}: {part!r} is not a length in tokens from {MIN_LENGTH} to "
                                f"{MAX_LENGTH}; write e.g. 2k,4k or 2048,4096")
        lengths.append(value)
    if not lengths or len(set(lengths)) != len(lengths):
        raise HeadwiseError(f"--lengths {text!r}: give distinct lengths, e.g. 2k,4k")
    return tuple(lengths)


# ---- prompts ------------------------------------------------------------------------------------------------------

def uses_chat(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def frame(tokenizer: Any) -> tuple[str, str]:
    """``(head, tail)``: the text before the user's content and between its end and the assistant's answer —
    the chat template's when the tokenizer has one, else ``("", "\\n")`` (plain text)."""
    if not uses_chat(tokenizer):
        return "", "\n"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                             add_generation_prompt=True)
    head, tail = rendered.split(MARK)
    return head, tail


def encode(tokenizer: Any, text: str, special: bool = False) -> list[int]:
    return tokenizer(text, add_special_tokens=special)["input_ids"]


@dataclass
class Draft:
    """A sample before it is fitted: its intro, the context as a function of a size ``n`` (haystack units or list
    entries), and its questions (question text, answer's first words, expected, match, tag)."""

    intro: str
    context: Callable[[int], str]
    questions: list[tuple[str, str, tuple[str, ...], str, str]]
    cap: int | None = None  # most units the context can take (None: unbounded)


def _depths(count: int, rng: random.Random) -> list[float]:
    """``count`` depths in [0, 1], one in each of ``count`` equal strata, shuffled."""
    depths = [(j + rng.random()) / count for j in range(count)]
    rng.shuffle(depths)
    return depths


def _haystack_context(units: list[str], needles: list[tuple[float, str]], end: str) -> Callable[[int], str]:
    """The context of the first ``n`` units with each needle, followed by ``end``, inserted before unit
    ``round(depth · n)`` (needles at the same place keep their order)."""
    def build(n: int) -> str:
        parts = list(units[:n])
        for depth, needle in sorted(needles, key=lambda x: x[0], reverse=True):
            parts.insert(round(depth * n), needle + end)
        return "".join(parts).strip()

    return build


def _key(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def _value(kind: str, rng: random.Random) -> str:
    if kind == "number":
        return str(rng.randint(1_000_000, 9_999_999))
    if kind == "word":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


KINDS = ("number", "word", "uuid")
NIAH_INTRO = "Some hidden values are placed in the following text. Memorize them: you will be asked about them."
NIAH_NEEDLE = "One hidden value for {key} is: {value}."
NIAH_QUESTION = "What are all the hidden values for {key} in the text above?"
NIAH_ANSWER = "The hidden values for {key} are:"


def _niah(rng: random.Random, index: int, seed_depth: float, units: list[str], end: str, keys: int, same_length
          ) -> Draft:
    if keys == 1:
        values = {_key(rng): [("number", _value("number", rng))]}
        depths = [(seed_depth + index * GOLDEN) % 1.0]
    else:
        chosen = same_length([_key(rng) for _ in range(64)], keys,
                             lambda k: NIAH_QUESTION.format(key=k), lambda k: NIAH_ANSWER.format(key=k))
        kinds = [KINDS[(index + j) % len(KINDS)] for j in range(keys)]
        doubled = rng.choice([j for j, kind in enumerate(kinds) if kind != "uuid"])  # short answers: no two UUIDs
        values = {}
        for j, (key, kind) in enumerate(zip(chosen, kinds)):
            values[key] = [(kind, _value(kind, rng)) for _ in range(2 if j == doubled else 1)]
        depths = _depths(sum(len(v) for v in values.values()), rng)
    needles = [NIAH_NEEDLE.format(key=key, value=value) for key, pairs in values.items() for _, value in pairs]
    questions = [(NIAH_QUESTION.format(key=key), NIAH_ANSWER.format(key=key), tuple(v for _, v in pairs), "all",
                  "+".join(sorted({kind for kind, _ in pairs})) + ("-multivalue" if len(pairs) > 1 else ""))
                 for key, pairs in values.items()]
    return Draft(NIAH_INTRO, _haystack_context(units, list(zip(depths, needles)), end), questions, len(units))


VT_INTRO = "The following text hides chains of variable assignments. Keep track of them: you will be asked about them."
VT_QUESTION = "Which variables hold the value {value}, directly or through other variables, in the text above?"
VT_ANSWER = "The variables that hold the value {value} are:"


def _vt(rng: random.Random, units: list[str], end: str, chains: int = 2, hops: int = 4) -> Draft:
    names: list[str] = []
    while len(names) < chains * (hops + 1):
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    needles, questions = [], []
    for c in range(chains):
        chain = names[c * (hops + 1):(c + 1) * (hops + 1)]
        value = str(rng.randint(10000, 99999))
        depths = sorted(_depths(hops + 1, rng))
        statements = [f"VAR {chain[0]} = {value}."] + [f"VAR {chain[j + 1]} = VAR {chain[j]}." for j in range(hops)]
        needles += list(zip(depths, statements))
        questions.append((VT_QUESTION.format(value=value), VT_ANSWER.format(value=value), tuple(chain), "all",
                          f"{hops}-hops"))
    return Draft(VT_INTRO, _haystack_context(units, needles, end), questions, len(units))


CWE_COMMON = 5
CWE_RATIO = 6  # a common word occurs this many times as often as any other
CWE_INTRO = "Below is a numbered list of words. A few words occur much more often than the others: remember which."
CWE_QUESTION = f"Which {CWE_COMMON} words occur most often in the list above?"
CWE_ANSWER = f"The {CWE_COMMON} words that occur most often are:"


def _cwe(rng: random.Random) -> Draft:
    words = list(dict.fromkeys(NOUNS + ADJECTIVES + VERBS))
    rng.shuffle(words)
    common, rare = words[:CWE_COMMON], words[CWE_COMMON:]
    order = rng.random()

    def build(n: int) -> str:
        repeats = 1 + n // (len(rare) + 1)  # n entries of rare words, each rare word `repeats` times at most
        entries = common * (CWE_RATIO * repeats) + [rare[i % len(rare)] for i in range(n)]
        random.Random(order).shuffle(entries)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(entries))

    return Draft(CWE_INTRO, build, [(CWE_QUESTION, CWE_ANSWER, tuple(common), "all", "")])


FWE_TOP = 3
FWE_ALPHA = 2.0
FWE_INTRO = "The following coded text repeats some coded words more often than others. Keep count of them."
FWE_QUESTION = f"Which {FWE_TOP} coded words occur most often in the coded text above?"
FWE_ANSWER = f"The {FWE_TOP} coded words that occur most often are:"


def _fwe(rng: random.Random, length: int) -> Draft:
    size = max(32, length // 50)
    vocab: list[str] = []
    while len(vocab) < size:
        word = "".join(rng.choices(string.ascii_lowercase, k=5))
        if word not in vocab:
            vocab.append(word)
    zeta = math.pi ** 2 / 6  # ζ(2): the Zipf law's normaliser at FWE_ALPHA = 2
    order = rng.random()

    def build(n: int) -> str:
        words = [w for k, w in enumerate(vocab, 1) for _ in range(int(n * k ** -FWE_ALPHA / zeta))]
        random.Random(order).shuffle(words)
        return " ".join(words)

    return Draft(FWE_INTRO, build, [(FWE_QUESTION, FWE_ANSWER, tuple(vocab[:FWE_TOP]), "all", "")])


QA_INTRO = "The following text mentions several people and where they live. Read it carefully: you will be asked about them."
QA_FACT = "{name}, a {job}, lives in {city}."
QA_QUESTION = "In which city does {name} live, according to the text above?"
QA_ANSWER = "{name} lives in"


def _qa(rng: random.Random, units: list[str], end: str, same_length, facts: int = 6, asked: int = 4) -> Draft:
    names = same_length([f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}" for _ in range(64)], facts,
                        lambda n: QA_QUESTION.format(name=n), lambda n: QA_ANSWER.format(name=n))
    cities = rng.sample(CITIES, facts)
    needles = [QA_FACT.format(name=n, job=rng.choice(PEOPLE), city=c) for n, c in zip(names, cities)]
    depths = _depths(facts, rng)
    questions = [(QA_QUESTION.format(name=n), QA_ANSWER.format(name=n), (c,), "any", "")
                 for n, c in list(zip(names, cities))[:asked]]
    return Draft(QA_INTRO, _haystack_context(units, list(zip(depths, needles)), end), questions, len(units))


# ---- the suite ----------------------------------------------------------------------------------------------------

@dataclass
class SuiteSpec:
    """What a suite draws: ``lengths`` (tokens), ``samples`` per task and length (an int, or ``{task: n}``),
    ``seed``, the ``haystack`` and the ``tasks``."""

    lengths: tuple[int, ...] = (2048,)
    samples: int | dict[str, int] = 8
    seed: int = SEED
    haystack: Haystack = field(default_factory=Haystack)
    tasks: tuple[str, ...] = TASKS

    def __post_init__(self) -> None:
        self.lengths = parse_lengths(self.lengths) if isinstance(self.lengths, str) else tuple(self.lengths)
        unknown = [t for t in self.tasks if t not in FAMILIES]
        if unknown or not self.tasks:
            raise HeadwiseError(f"long-context tasks {unknown or '(none)'}: choose from {', '.join(TASKS)}")
        counts = self.samples.values() if isinstance(self.samples, dict) else [self.samples]
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
            raise HeadwiseError(f"--samples {self.samples!r}: give a positive number of samples per task and length")
        if isinstance(self.samples, dict) and set(self.samples) != set(self.tasks):
            raise HeadwiseError(f"samples per task {sorted(self.samples)} must name exactly the tasks {list(self.tasks)}")

    def count(self, task: str) -> int:
        return self.samples[task] if isinstance(self.samples, dict) else self.samples

    def identity(self) -> dict[str, Any]:
        """What fixes every sample's content (not which samples are drawn): seed, haystack, needle formats."""
        return {"seed": self.seed, "haystack": self.haystack.source,
                "needles": "hidden values (7-digit numbers, adjective-noun words, UUIDs), VAR chains, "
                           "'NAME, a JOB, lives in CITY.' facts; numbered word lists; Zipf coded words"}

    def describe(self) -> dict[str, Any]:
        """What the samples were drawn from (written with every result)."""
        return self.identity() | {"haystack_name": self.haystack.name, "licence": self.haystack.licence,
                                  "lengths": list(self.lengths), "tasks": list(self.tasks),
                                  "samples": {t: self.count(t) for t in self.tasks}}

    def keys(self) -> list[tuple[str, int, int]]:
        """``(task, length, index)`` of every sample, in the order they run."""
        return [(t, n, i) for n in self.lengths for t in self.tasks for i in range(self.count(t))]


def same_length_picker(tokenizer: Any, tail: str) -> Callable:
    """``pick(candidates, k, question, answer)``: ``k`` distinct candidates whose question tokens (``question(c)`` +
    ``tail`` + ``answer(c)``) are as long as the first one's where possible, so a runner can batch them."""
    def pick(candidates: list[str], k: int, question, answer) -> list[str]:
        unique = list(dict.fromkeys(candidates))
        if len(unique) < k:
            raise HeadwiseError(f"only {len(unique)} distinct candidates for {k} keys")
        size = {c: len(encode(tokenizer, question(c) + tail + answer(c))) for c in unique}
        first = size[unique[0]]
        same = [c for c in unique if size[c] == first]
        return (same + [c for c in unique if size[c] != first])[:k]

    return pick


def draw(tokenizer: Any, task: str, length: int, index: int, spec: SuiteSpec) -> Sample:
    """Sample ``index`` of ``task`` at ``length`` tokens (see the module docstring); deterministic for
    ``spec.seed``, the haystack and the tokenizer."""
    if task not in FAMILIES:
        raise HeadwiseError(f"unknown long-context task {task!r}; choose from {', '.join(TASKS)}")
    rng = random.Random(f"{spec.seed}/{task}/{length}/{index}")
    head, tail = frame(tokenizer)
    pick = same_length_picker(tokenizer, tail)
    units_rng = random.Random(f"{spec.seed}/haystack/{task}/{length}/{index}")
    stream = spec.haystack.units(units_rng)
    units = [next(stream) for _ in range(max(64, length // 4))]  # more than the context can hold
    seed_depth = random.Random(f"{spec.seed}/{task}/{length}").random()
    end = spec.haystack.end
    draft = {"niah_single": lambda: _niah(rng, index, seed_depth, units, end, 1, pick),
             "niah_multi": lambda: _niah(rng, index, seed_depth, units, end, 4, pick),
             "vt": lambda: _vt(rng, units, end), "cwe": lambda: _cwe(rng), "fwe": lambda: _fwe(rng, length),
             "qa": lambda: _qa(rng, units, end, pick)}[task]()
    questions = []
    for question, answer, expected, match, tag in draft.questions:
        ids = encode(tokenizer, question + tail + answer)
        max_new = len(encode(tokenizer, " " + ", ".join(expected))) + SLACK
        questions.append(Question(tuple(ids), expected, max_new, match, tag))
    room = length - max(len(q.ids) + q.max_new for q in questions)

    def context_ids(n: int) -> list[int]:
        return encode(tokenizer, head + draft.intro + "\n\n" + draft.context(n) + "\n\n", special=True)

    n = _largest_fitting(context_ids, room, draft.cap)
    ids = context_ids(n)
    if n == 0 or len(ids) > room:
        raise HeadwiseError(f"long-context task {task}: {length} tokens leave no room for a context with this "
                            f"tokenizer; use a longer length (e.g. 2k)")
    return Sample(task, length, index, tuple(ids), tuple(questions))


def _largest_fitting(context_ids: Callable[[int], list[int]], room: int, cap: int | None) -> int:
    """The largest ``n`` (≤ ``cap``) whose context takes at most ``room`` tokens (0: none fits)."""
    low, high = 0, 1
    while len(context_ids(high)) <= room:
        low, high = high, high * 2
        if cap is not None and high > cap:
            if len(context_ids(cap)) <= room:
                raise HeadwiseError("the haystack ran out before the context was long enough")
            high = cap
            break
    while high - low > 1:
        mid = (low + high) // 2
        if len(context_ids(mid)) <= room:
            low = mid
        else:
            high = mid
    return low
