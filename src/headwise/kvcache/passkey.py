"""Synthetic passkey prompts: a 5-digit key hidden at a given depth of a haystack of repeated filler sentences.

A tokenizer with a chat template gets the prompt as one user turn (intro, haystack, question) and an assistant turn
that starts with ``ANSWER``, so the key is the model's next tokens; an instruct model asked in raw text tends to
continue the sentence instead ("The pass key is a magical number…"). Tokenizers without a template get the raw text
with the question and ``ANSWER`` at its end.

Used to calibrate retrieval scores (``scores``), to train KV gates (``learn``) and to measure retrieval through a
cache (``passkey_accuracy``, ``experiments/``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
INTRO = "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n\n"
QUESTION = "\n\nWhat is the pass key?"
INSTRUCTION = " Answer with the number only."  # in the user turn of a chat prompt
ANSWER = "The pass key is"
MARK = "\x00"  # stands for the user turn while the chat template is rendered


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


def frame(tokenizer: Any, chat: bool | None = None) -> tuple[str, str]:
    """``(before, after)``: the text around the haystack (the needle inside it), intro and question included,
    through the chat template when ``uses_chat``; ``after`` ends with ``ANSWER``."""
    if not uses_chat(tokenizer, chat):
        return INTRO, QUESTION + " " + ANSWER
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                             add_generation_prompt=True)
    head, tail = rendered.split(MARK)
    return head + INTRO, QUESTION + INSTRUCTION + tail + ANSWER


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def passkey_prompt(tokenizer: Any, length: int, depth: float, key: str, chat: bool | None = None) -> Passkey:
    """A prompt of about ``length`` tokens with ``key`` at relative ``depth`` (0 = start, 1 = end of the haystack)."""
    before_text, after_text = frame(tokenizer, chat)
    filler_tokens = len(encode(tokenizer, FILLER))
    fixed = len(encode(tokenizer, before_text + NEEDLE.format(key=key) + after_text))
    repeats = max(1, (length - fixed) // filler_tokens)
    before = round(repeats * depth)
    head = before_text + FILLER * before
    text = head + NEEDLE.format(key=key) + FILLER * (repeats - before) + after_text
    needle_prefix = "The pass key is"
    start = len(encode(tokenizer, head + needle_prefix))
    end = len(encode(tokenizer, head + needle_prefix + " " + key))
    answer = encode(tokenizer, " " + key)
    return Passkey(torch.tensor(encode(tokenizer, text)), key, torch.tensor(answer), (start, end), depth)


def passkey_prompts(tokenizer: Any, length: int, depths: list[float], keys: int, seed: int = 0,
                    chat: bool | None = None) -> list[Passkey]:
    """``keys`` random 5-digit keys at each depth (``len(depths) × keys`` prompts)."""
    rng = random.Random(seed)
    return [passkey_prompt(tokenizer, length, d, str(rng.randint(10000, 99999)), chat)
            for d in depths for _ in range(keys)]


def passkey_accuracy(model: Any, tokenizer: Any, prompts: list[Passkey], progress: bool = True) -> dict[str, Any]:
    """Greedy ``model.generate()`` on each prompt (through whatever cache it uses); exact match of the key.

    Returns ``{"accuracy", "correct", "prompts", "answers"}``."""
    from ..progress import progress_bar

    answers, correct = [], 0
    for p in progress_bar(prompts, desc="passkey", disable=not progress):
        ids = p.ids[None].to(model.device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(p.answer_ids),
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        answers.append(text)
        correct += text.strip() == p.key
    return {"accuracy": correct / max(len(prompts), 1), "correct": correct, "prompts": len(prompts),
            "answers": answers}
