"""Synthetic passkey prompts: a 5-digit key hidden at a given depth of a haystack.

Three haystacks (``HAYSTACKS``), each a stream of whole units the needle sentence goes between:
- ``filler``: the same five short sentences repeated (the classic passkey test);
- ``text``: running natural text given by the caller (e.g. WikiText-2), cut into sentences, from a seeded offset;
- ``numbers``: a code-like list of assignments of random decimals (``item_0412 = 3.82, 0.51, 19.6``), seeded.
A prompt family is a haystack with or without the chat template (``PromptFamily``).

A tokenizer with a chat template gets the prompt as one user turn (intro, haystack, question) and an assistant turn
that starts with ``ANSWER``, so the key is the model's next tokens; an instruct model asked in raw text tends to
continue the sentence instead ("The pass key is a magical number…"). Tokenizers without a template get the raw text
with the question and ``ANSWER`` at its end.

Used to calibrate retrieval scores (``scores``), to train KV gates (``learn``) and to measure retrieval through a
cache (``passkey_accuracy``, ``experiments/``); the fact-lookup prompts (``lookup``) place their needles and word
their frame with the same ``place_needles`` and ``Wording``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..errors import HeadwiseError

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
INTRO = "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n\n"
QUESTION = "\n\nWhat is the pass key?"
INSTRUCTION = " Answer with the number only."  # in the user turn of a chat prompt
ANSWER = "The pass key is"
MARK = "\x00"  # stands for the user turn while the chat template is rendered
HAYSTACKS = ("filler", "text", "numbers")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class Passkey:
    """One prompt: ``ids [T]``, the key as text, and the token span ``needle`` holding the key's first mention."""

    ids: torch.Tensor
    key: str
    answer_ids: torch.Tensor  # the tokens of " {key}"
    needle: tuple[int, int]  # [start, end) token positions of the key inside the needle sentence
    depth: float


def uses_chat(tokenizer: Any, chat: bool | None = None) -> bool:
    """``chat`` as given, or (``None``) whether ``tokenizer`` has a chat template."""
    return bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat


@dataclass(frozen=True)
class Wording:
    """What a probe says around its haystack: ``intro`` before it, ``question`` after it, ``instruction`` closing a
    chat's user turn and ``answer``, the first words of the reply (the value is the model's next tokens)."""

    intro: str
    question: str
    instruction: str
    answer: str


PASSKEY = Wording(INTRO, QUESTION, INSTRUCTION, ANSWER)


def frame(tokenizer: Any, chat: bool | None = None, wording: Wording = PASSKEY) -> tuple[str, str]:
    """``(before, after)``: the text around the haystack (the needles inside it), intro and question included,
    through the chat template when ``uses_chat``; ``after`` ends with the answer's first words."""
    w = wording
    if not uses_chat(tokenizer, chat):
        return w.intro, w.question + " " + w.answer
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                             add_generation_prompt=True)
    head, tail = rendered.split(MARK)
    return head + w.intro, w.question + w.instruction + tail + w.answer


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class PromptFamily:
    """Passkey prompts of one kind: a ``haystack`` (one of ``HAYSTACKS``) with or without the chat template
    (``chat=None``: the tokenizer's template when it has one)."""

    haystack: str = "filler"
    chat: bool | None = None

    def __post_init__(self) -> None:
        if self.haystack not in HAYSTACKS:
            raise HeadwiseError(f"unknown haystack {self.haystack!r}; use one of {', '.join(HAYSTACKS)}")

    @property
    def name(self) -> str:
        return self.haystack + {None: "", True: "-chat", False: "-raw"}[self.chat]

    @classmethod
    def parse(cls, name: str) -> "PromptFamily":
        """``filler``, ``text-chat``, ``numbers-raw``, …: a haystack, then ``-chat`` / ``-raw`` or nothing."""
        haystack, _, template = name.partition("-")
        if template not in ("", "chat", "raw"):
            raise HeadwiseError(f"prompt family {name!r}: write HAYSTACK, HAYSTACK-chat or HAYSTACK-raw "
                                f"(haystacks: {', '.join(HAYSTACKS)})")
        return cls(haystack, {"": None, "chat": True, "raw": False}[template])


def text_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (split after ``.``, ``!``, ``?``), each ending in a space: the ``text`` haystack's
    units."""
    units = [u.strip() for line in text.splitlines() for u in SENTENCE_END.split(line)]
    return [u + " " for u in units if u]


def haystack_units(haystack: str, rng: random.Random, sentences: list[str] | None = None) -> Iterator[str]:
    """An endless stream of haystack units (see the module docstring); ``sentences``: the ``text`` haystack's
    (``text_sentences``), read from a seeded offset and wrapped around."""
    if haystack == "filler":
        while True:
            yield FILLER
    elif haystack == "text":
        if not sentences:
            raise HeadwiseError("the 'text' haystack needs running text: pass text=... (headwise kv-policy takes it "
                                "from --data, e.g. shared/data/wikitext-2/valid.txt), or use the 'filler' or "
                                "'numbers' haystack")
        at = rng.randrange(len(sentences))
        while True:
            yield sentences[at % len(sentences)]
            at += 1
    elif haystack == "numbers":
        while True:
            values = ", ".join(f"{rng.uniform(0, 100):.{rng.randint(1, 2)}f}" for _ in range(rng.randint(2, 4)))
            yield f"item_{rng.randrange(10000):04d} = {values}\n"
    else:
        raise HeadwiseError(f"unknown haystack {haystack!r}; use one of {', '.join(HAYSTACKS)}")


def place_needles(tokenizer: Any, length: int, before_text: str, after_text: str, needles: list[tuple[float, str]],
                  units: Iterator[str]) -> tuple[list[int], list[str]]:
    """The ids of ``before_text``, whole haystack ``units`` as many as fit ``length`` tokens with each needle
    ``(depth, sentence)`` between them (depth 0 = the haystack's start, 1 = its end), and ``after_text``; and for each
    needle, the text before it."""
    room = length - len(encode(tokenizer, before_text + "".join(n for _, n in needles) + after_text))
    hay, used = [], 0
    while True:
        unit = next(units)
        size = len(encode(tokenizer, unit))
        if hay and used + size > room:
            break
        hay.append(unit)
        used += size
    while True:  # a unit boundary can tokenize differently from the unit alone: drop units until it fits
        slots = [round(len(hay) * depth) for depth, _ in needles]
        text, heads = before_text, [""] * len(needles)
        for at in range(len(hay) + 1):
            for i in (i for i, slot in enumerate(slots) if slot == at):
                heads[i] = text
                text += needles[i][1]
            text += hay[at] if at < len(hay) else ""
        ids = encode(tokenizer, text + after_text)
        if len(ids) <= length or len(hay) == 1:
            return ids, heads
        hay.pop()


def passkey_prompt(tokenizer: Any, length: int, depth: float, key: str, chat: bool | None = None,
                   units: Iterator[str] | None = None) -> Passkey:
    """A prompt of at most about ``length`` tokens with ``key`` at relative ``depth`` (0 = start, 1 = end of the
    haystack), the haystack made of whole ``units`` (default: the filler sentences) as many as fit."""
    before_text, after_text = frame(tokenizer, chat)
    units = units if units is not None else haystack_units("filler", random.Random(0))
    ids, (head,) = place_needles(tokenizer, length, before_text, after_text, [(depth, NEEDLE.format(key=key))], units)
    needle_prefix = "The pass key is"
    start = len(encode(tokenizer, head + needle_prefix))
    end = len(encode(tokenizer, head + needle_prefix + " " + key))
    answer = encode(tokenizer, " " + key)
    return Passkey(torch.tensor(ids), key, torch.tensor(answer), (start, end), depth)


def passkey_prompts(tokenizer: Any, length: int, depths: list[float], keys: int, seed: int = 0,
                    chat: bool | None = None, haystack: str = "filler", text: str | None = None) -> list[Passkey]:
    """``keys`` random 5-digit keys at each depth (``len(depths) × keys`` prompts) in ``haystack`` (``text``: the
    running text of the ``text`` haystack), all drawn from ``seed``."""
    rng = random.Random(seed)
    sentences = text_sentences(text) if haystack == "text" and text else None
    prompts = []
    for d in depths:
        for _ in range(keys):
            key = str(rng.randint(10000, 99999))
            prompts.append(passkey_prompt(tokenizer, length, d, key, chat, haystack_units(haystack, rng, sentences)))
    return prompts


def family_prompts(tokenizer: Any, family: PromptFamily, length: int, depths: list[float], keys: int,
                   seed: int = 0, text: str | None = None) -> list[Passkey]:
    """``passkey_prompts`` of one ``family``."""
    return passkey_prompts(tokenizer, length, depths, keys, seed, family.chat, family.haystack, text)


def greedy_continuation(model: Any, ids: torch.Tensor, new: int, prefill_chunk: int | None = None,
                        pad_token_id: int | None = None) -> torch.Tensor:
    """Greedy ``model.generate()`` of ``new`` tokens after ``ids [T]`` through the cache it builds (the model's
    ``PolicyCache`` under a KV policy), the prompt prefilled ``prefill_chunk`` tokens at a time (``generate``'s
    ``prefill_chunk_size``; None: what the model's policy records, else the whole prompt). A head's rule holds for
    every query, whatever the chunking. Returns ``[≤ new]`` (it stops after an end-of-sequence token)."""
    if prefill_chunk is not None and prefill_chunk < 1:
        raise HeadwiseError(f"prefill_chunk={prefill_chunk} must be a positive number of tokens")
    ids = ids[None].to(model.device)
    chunking = {} if prefill_chunk is None else {"prefill_chunk_size": prefill_chunk}
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             pad_token_id=pad_token_id, **chunking)
    return out[0, ids.shape[1]:]


def passkey_accuracy(model: Any, tokenizer: Any, prompts: list[Passkey], progress: bool = True,
                     prefill_chunk: int | None = None) -> dict[str, Any]:
    """Greedy ``model.generate()`` on each prompt (through whatever cache it uses); exact match of the key.
    ``prefill_chunk``: prefill that many tokens at a time (``greedy_continuation``; the same answers).

    Returns ``{"accuracy", "correct", "prompts", "answers"}``."""
    from ..progress import progress_bar

    answers, correct = [], 0
    for p in progress_bar(prompts, desc="passkey", disable=not progress):
        out = greedy_continuation(model, p.ids, len(p.answer_ids), prefill_chunk, tokenizer.eos_token_id)
        text = tokenizer.decode(out, skip_special_tokens=True)
        answers.append(text)
        correct += text.strip() == p.key
    return {"accuracy": correct / max(len(prompts), 1), "correct": correct, "prompts": len(prompts),
            "answers": answers}
