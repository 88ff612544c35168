"""What learning a score per KV head, DuoAttention style, needs from the cache package: the gates' options
(``KVGateConfig``), their training prompts (``gate_prompts``), the frozen model and its gate-free outputs
(``frozen``, ``bypassed``, ``last_hidden``) and the result (``LearnedGates``).

The training itself (the MSE between the last hidden states of the gated and the unedited model on the positions
that predict the key, plus ``l1 · mean(α)``; ``α`` clipped to ``[0, 1]`` after each Adam step) is
``headwise.training.train_kv_gates``, through the shared Trainer (data-parallel under torchrun). Heads whose ``α``
stays high need the full cache; rank by it.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
from einops import repeat
from torch import nn

from ..errors import HeadwiseError
from .gates import KVGate
from .passkey import NEEDLE, frame, passkey_prompt
from .scores import HeadScores

REGIONS = ("answer", "all")
HAYSTACKS = ("filler", "text")


@dataclass
class KVGateConfig:
    """``steps`` Adam steps at ``lr`` on one prompt of ``length`` tokens each (a 5-digit key at a random depth in a
    ``haystack`` of repeated filler sentences, or of the given texts); the distillation covers ``region``
    (``answer``: the positions that predict the key; ``all``: every position); ``l1`` weighs ``mean(α)``; gates
    start at ``init`` and mix full attention with ``streaming(sink, window)``."""

    steps: int = 500
    lr: float = 0.02
    l1: float = 0.05
    length: int = 1024
    sink: int = 4
    window: int = 124
    region: str = "answer"
    haystack: str = "filler"
    init: float = 1.0
    seed: int = 0

    def check(self) -> None:
        """Raise ``HeadwiseError`` naming the first bad option."""
        if int(self.steps) != self.steps or self.steps < 1:
            raise HeadwiseError(f"gate steps={self.steps!r} must be an integer ≥ 1")
        if not self.lr > 0:
            raise HeadwiseError(f"gate lr={self.lr!r} must be > 0")
        if not self.l1 >= 0:
            raise HeadwiseError(f"gate l1={self.l1!r} must be ≥ 0 (the weight of mean(α) in the loss)")
        if self.region not in REGIONS:
            raise HeadwiseError(f"gate region={self.region!r}: use one of {', '.join(REGIONS)}")
        if self.haystack not in HAYSTACKS:
            raise HeadwiseError(f"gate haystack={self.haystack!r}: use one of {', '.join(HAYSTACKS)}")
        if not 0.0 <= self.init <= 1.0:
            raise HeadwiseError(f"gate init={self.init!r} must be in [0, 1]")
        if self.length <= self.sink + self.window + 1:
            raise HeadwiseError(f"gate length={self.length} must exceed sink {self.sink} + window {self.window} + 1: "
                                "shorter prompts look the same through both caches, so nothing can be learned")


@dataclass
class LearnedGates:
    """``alpha [layers, KV heads]`` after training; ``history``: ``{step, loss, mean_alpha}`` per step (the
    Trainer's logs)."""

    alpha: torch.Tensor
    config: KVGateConfig
    history: list[dict[str, float]] = field(default_factory=list)

    def scores(self, num_heads: int) -> HeadScores:
        """As ``HeadScores`` named ``learned``: ``α`` per query head (its KV head's), ``kv("learned") == alpha``."""
        group = num_heads // self.alpha.shape[1]
        per_query = repeat(self.alpha, "l h -> l (h g)", g=group)
        return HeadScores({"learned": per_query}, [self.alpha.shape[1]] * self.alpha.shape[0],
                          {"gate_steps": self.config.steps})

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha.tolist(), "config": asdict(self.config), "history": self.history}


def _text_prompt(tokenizer: Any, length: int, depth: float, key: str, text: torch.Tensor,
                 rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt ids, answer ids)``: the passkey prompt's frame (``passkey.frame``) and needle around a haystack
    cut from ``text [N]`` (token level) at a random offset."""
    def encode(s: str) -> torch.Tensor:
        return torch.tensor(tokenizer(s, add_special_tokens=False)["input_ids"], dtype=torch.long)

    before, after = frame(tokenizer)
    intro, needle, question = encode(before), encode(NEEDLE.format(key=key)), encode(after)
    room = length - len(intro) - len(needle) - len(question)
    if room < 1 or len(text) < room:
        raise HeadwiseError(f"haystack texts hold {len(text)} tokens; a {length}-token prompt needs {max(room, 1)}: "
                            "give longer texts or a shorter gate length")
    start = rng.randint(0, len(text) - room)
    hay = text[start: start + room]
    before = round(room * depth)
    return torch.cat([intro, hay[:before], needle, hay[before:], question]), encode(" " + key)


def gate_prompts(tokenizer: Any, config: KVGateConfig,
                 texts: list[str] | None = None) -> Iterator[tuple[torch.Tensor, slice]]:
    """Endless seeded ``(ids [T], region)``: a passkey prompt with its key appended, and the positions the loss
    covers (``answer``: those whose next token is a token of the key)."""
    rng = random.Random(config.seed)
    text = None
    if config.haystack == "text":
        if not texts:
            raise HeadwiseError("gate haystack='text' needs texts; pass texts= or use haystack='filler'")
        text = torch.tensor(tokenizer("\n".join(texts), add_special_tokens=False)["input_ids"], dtype=torch.long)
    while True:
        depth, key = rng.random(), str(rng.randint(10000, 99999))
        if text is None:
            p = passkey_prompt(tokenizer, config.length, depth, key)
            prompt, answer = p.ids, p.answer_ids
        else:
            prompt, answer = _text_prompt(tokenizer, config.length, depth, key, text, rng)
        ids = torch.cat([prompt, answer])
        region = slice(len(prompt) - 1, len(ids) - 1) if config.region == "answer" else slice(0, len(ids))
        yield ids, region


@contextmanager
def bypassed(gates: list[KVGate]) -> Iterator[None]:
    """Inside the block the gates pass full attention through: the model computes its unedited outputs."""
    for g in gates:
        g.bypass = True
    try:
        yield
    finally:
        for g in gates:
            g.bypass = False


@contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """Model weights take no gradient and the model runs in eval mode inside the block; restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    training = model.training
    for p, _ in flags:
        p.requires_grad_(False)
    model.eval()
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(training)


def last_hidden(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The last hidden states ``[B, T, hidden]`` (the base model's output: no LM head, no logits)."""
    base = getattr(model, "base_model", model)
    return base(input_ids=ids, use_cache=False).last_hidden_state
