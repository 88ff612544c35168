"""Synthetic passkey prompts: a 5-digit key hidden at a given depth of a haystack of repeated filler sentences.

Used to calibrate retrieval scores (``scores``) and to measure retrieval through a cache (``experiments/``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
INTRO = "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n\n"
QUESTION = "\n\nWhat is the pass key? The pass key is"


@dataclass
class Passkey:
    """One prompt: ``ids [T]``, the key as text, and the token span ``needle`` holding the key's first mention."""

    ids: torch.Tensor
    key: str
    answer_ids: torch.Tensor  # the tokens of " {key}"
    needle: tuple[int, int]  # [start, end) token positions of the key inside the needle sentence
    depth: float


def passkey_prompt(tokenizer: Any, length: int, depth: float, key: str) -> Passkey:
    """A prompt of about ``length`` tokens with ``key`` at relative ``depth`` (0 = start, 1 = end of the haystack)."""
    filler_tokens = len(tokenizer(FILLER, add_special_tokens=False)["input_ids"])
    fixed = len(tokenizer(INTRO + NEEDLE.format(key=key) + QUESTION, add_special_tokens=False)["input_ids"])
    repeats = max(1, (length - fixed) // filler_tokens)
    before = round(repeats * depth)
    head = INTRO + FILLER * before
    needle_prefix = "The pass key is"
    text = head + NEEDLE.format(key=key) + FILLER * (repeats - before) + QUESTION
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = len(tokenizer(head + needle_prefix, add_special_tokens=False)["input_ids"])
    end = len(tokenizer(head + needle_prefix + " " + key, add_special_tokens=False)["input_ids"])
    answer = tokenizer(" " + key, add_special_tokens=False)["input_ids"]
    return Passkey(torch.tensor(ids), key, torch.tensor(answer), (start, end), depth)


def passkey_prompts(tokenizer: Any, length: int, depths: list[float], keys: int, seed: int = 0) -> list[Passkey]:
    """``keys`` random 5-digit keys at each depth (``len(depths) × keys`` prompts)."""
    rng = random.Random(seed)
    return [passkey_prompt(tokenizer, length, d, str(rng.randint(10000, 99999))) for d in depths for _ in range(keys)]


def passkey_accuracy(model: Any, tokenizer: Any, prompts: list[Passkey], progress: bool = True) -> dict[str, Any]:
    """Greedy ``model.generate()`` on each prompt (through whatever cache it uses); exact match of the key.

    Returns ``{"accuracy", "correct", "prompts", "answers"}``."""
    from tqdm.auto import tqdm

    answers, correct = [], 0
    for p in tqdm(prompts, desc="passkey", disable=not progress):
        ids = p.ids[None].to(model.device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(p.answer_ids),
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        answers.append(text)
        correct += text.strip() == p.key
    return {"accuracy": correct / max(len(prompts), 1), "correct": correct, "prompts": len(prompts),
            "answers": answers}
