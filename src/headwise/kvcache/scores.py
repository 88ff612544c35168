"""Training-free head scores for the KV cache, per query head and per KV head (a GQA group counts once: max).

- ``retrieval``: attention mass on the passkey's digits while the model predicts them (teacher forced), on passkey
  prompts of every calibration family (``ScoreConfig.families``: the filler haystack through the chat template by
  default; see ``passkey.PromptFamily``);
- ``copy``: share of those steps whose arg-max key is the very digit being predicted (Wu et al.'s retrieval heads);
- ``lookup``: attention mass on the asked word while the model says it, on fact-lookup prompts of the same families
  (``lookup``: ``ScoreConfig.facts`` look-alike facts, one asked; ``facts=0`` leaves the score out);
- ``induction`` / ``echo``: on a random sequence repeated twice, mass on the token after / at the previous
  occurrence of the current token (RazorAttention keeps such heads whole);
- ``outside``: on calibration text, attention mass that a ``streaming(sink, window)`` cache would drop.

Every score comes from one forward per prompt with an observer on each site (the explicit softmax path, no cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..errors import HeadwiseError
from ..progress import progress_bar
from ..runtime import add_observer, detach
from ..sites import find_sites
from .policy import model_shape
from .lookup import lookup_prompts
from .passkey import Passkey, PromptFamily, family_prompts

OBSERVER = "kv_scores"
NAMES = ("retrieval", "copy", "lookup", "induction", "echo", "outside")


@dataclass
class ScoreConfig:
    """What to run: passkey prompts (``length`` tokens, ``depths`` × ``keys`` per prompt family of ``families``,
    e.g. ``("filler", "numbers-raw")``; see ``PromptFamily.parse``), as many fact-lookup prompts of ``facts`` facts
    each (0: none), ``random_length`` random tokens repeated twice (``random_sequences`` of them), and the
    sink/window whose dropped mass ``outside`` measures on calibration texts of ``text_length`` tokens (None:
    ``length``)."""

    length: int = 512
    depths: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    keys: int = 1
    facts: int = 4
    random_length: int = 128
    random_sequences: int = 2
    sink: int = 4
    window: int = 124
    text_length: int | None = None
    seed: int = 0
    families: tuple[str, ...] = ("filler",)


@dataclass
class HeadScores:
    """``scores[name]``: ``[layers, query heads]`` means over prompts; ``kv(name)``: ``[layers, KV heads]``."""

    scores: dict[str, torch.Tensor]
    kv_heads: list[int]
    counts: dict[str, int] = field(default_factory=dict)

    def kv(self, name: str) -> torch.Tensor:
        s = self.scores[name]
        group = s.shape[1] // self.kv_heads[0]
        return s.unflatten(1, (self.kv_heads[0], group)).amax(-1)

    def to_dict(self) -> dict[str, Any]:
        return {"per_query_head": {k: v.tolist() for k, v in self.scores.items()},
                "per_kv_head": {k: self.kv(k).tolist() for k in self.scores}, "prompts": self.counts}


def _observe(model: nn.Module, reduce: Callable[[int, torch.Tensor], None]) -> list:
    sites = [s for s in find_sites(model) if s.kind == "dec-self"]
    for site in sites:
        add_observer(site, OBSERVER, lambda probs, keep, out, layer=site.layer: reduce(layer, probs[0].float()))
    return sites


def _run(model: nn.Module, ids: torch.Tensor, reduce: Callable[[int, torch.Tensor], None]) -> None:
    sites = _observe(model, reduce)
    try:
        with torch.no_grad():
            model(input_ids=ids[None].to(model.device), use_cache=False)
    finally:
        for site in sites:
            detach(site, OBSERVER)


def needle_scores(model: nn.Module, prompt: Passkey, total: dict[str, torch.Tensor], mass: str = "retrieval",
                  copy: str | None = "copy") -> None:
    """Add each head's attention mass on ``prompt.needle`` while the model predicts its answer (teacher forced) to
    ``total[mass] [layers, heads]``, and the share of those steps whose arg-max key is the token being predicted to
    ``total[copy]`` (None: not counted)."""
    ids = torch.cat([prompt.ids, prompt.answer_ids])
    first = len(prompt.ids) - 1  # the query that predicts the first answer token
    queries = torch.arange(first, first + len(prompt.answer_ids))
    start, end = prompt.needle
    # the needle position holding the token each query must produce (the key's tokens as they appear there)
    targets = torch.arange(end - len(prompt.answer_ids), end).clamp(min=start)

    def reduce(layer: int, probs: torch.Tensor) -> None:  # probs [H, T, T]
        rows = probs[:, queries.to(probs.device)]
        total[mass][layer] += rows[..., start:end].sum(-1).mean(-1).cpu()
        if copy is not None:
            total[copy][layer] += (rows.argmax(-1).cpu() == targets).float().mean(-1)

    _run(model, ids, reduce)


def _repeated(model: nn.Module, ids: torch.Tensor, n: int, total: dict[str, torch.Tensor]) -> None:
    queries = torch.arange(n + 1, 2 * n)  # the second copy, after its first token

    def reduce(layer: int, probs: torch.Tensor) -> None:
        rows = probs[:, queries.to(probs.device)]
        q = torch.arange(len(queries), device=probs.device)
        total["echo"][layer] += rows[:, q, (queries - n).to(probs.device)].mean(-1).cpu()
        total["induction"][layer] += rows[:, q, (queries - n + 1).to(probs.device)].mean(-1).cpu()

    _run(model, ids, reduce)


def _outside(model: nn.Module, ids: torch.Tensor, sink: int, window: int, total: dict[str, torch.Tensor]) -> None:
    t = len(ids)

    def reduce(layer: int, probs: torch.Tensor) -> None:
        i = torch.arange(t, device=probs.device)[:, None]
        j = torch.arange(t, device=probs.device)[None, :]
        dropped = (j >= sink) & (i - j > window)
        rows = i[:, 0] - window > sink  # queries that drop anything
        total["outside"][layer] += (probs * dropped).sum(-1)[:, rows].mean(-1).cpu()

    _run(model, ids, reduce)


def repeated_tokens(config: ScoreConfig, vocab: int) -> list[torch.Tensor]:
    """``config.random_sequences`` random sequences ``[2 · random_length]``: ids drawn from the upper half of the
    vocabulary (no special tokens), each repeated twice."""
    g = torch.Generator().manual_seed(config.seed)
    return [torch.randint(vocab // 2, vocab, (config.random_length,), generator=g).repeat(2)
            for _ in range(config.random_sequences)]


def head_scores(model: nn.Module, tokenizer: Any, config: ScoreConfig | None = None,
                texts: list[str] | None = None, progress: bool = True,
                haystack_text: str | None = None) -> HeadScores:
    """Score every head of a decoder-only ``model`` (see the module docstring). ``texts``: calibration text for
    ``outside`` (each cut to ``config.text_length`` tokens, default ``config.length``); without it ``outside`` is
    left out. ``haystack_text``: the
    running text of a ``text`` calibration family."""
    config = config or ScoreConfig()
    families = [PromptFamily.parse(name) for name in config.families]
    if not families:
        raise HeadwiseError("ScoreConfig.families is empty; give at least one prompt family (e.g. ('filler',))")
    kv_heads = model_shape(model)
    sites = [s for s in find_sites(model) if s.kind == "dec-self"]
    heads = sites[0].num_heads
    names = [n for n in NAMES if (n != "outside" or texts) and (n != "lookup" or config.facts)]
    total = {n: torch.zeros(len(sites), heads) for n in names}
    prompts = [p for family in families for p in family_prompts(tokenizer, family, config.length,
                                                                 list(config.depths), config.keys, config.seed,
                                                                 haystack_text)]
    lookups = [p for family in families if config.facts
               for p in lookup_prompts(tokenizer, family, config.length, list(config.depths), config.keys,
                                       config.facts, config.seed, haystack_text)]
    randoms = repeated_tokens(config, min(len(tokenizer), model.config.vocab_size))
    cut = config.text_length or config.length
    if texts and cut <= config.sink + config.window + 1:
        raise HeadwiseError(f"'outside' measures the attention a sink {config.sink} + window {config.window} cache "
                            f"drops, but calibration texts are cut to ScoreConfig.text_length={cut} tokens, "
                            f"where it drops nothing; use a length above {config.sink + config.window + 1} (CLI: "
                            "--calibration-length) or rank without 'outside' (ranking='retrieval')")
    calibration = []
    for text in texts or []:
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0][:cut]
        if len(ids) > config.sink + config.window + 1:
            calibration.append(ids)
    if texts and not calibration:
        raise HeadwiseError(f"calibration texts are shorter than sink + window + 2 = {config.sink + config.window + 2}"
                            " tokens; give longer texts or a smaller window")
    jobs = ([(lambda p=p: needle_scores(model, p, total)) for p in prompts]
            + [(lambda p=p: needle_scores(model, p, total, "lookup", None)) for p in lookups]
            + [(lambda r=r: _repeated(model, r, config.random_length, total)) for r in randoms]
            + [(lambda c=c: _outside(model, c, config.sink, config.window, total)) for c in calibration])
    for job in progress_bar(jobs, desc="head scores", disable=not progress):
        job()
    counts = {"passkey": len(prompts), "lookup": len(lookups), "repeated": len(randoms),
              "calibration": len(calibration)}
    divisor = {"retrieval": len(prompts), "copy": len(prompts), "lookup": len(lookups), "induction": len(randoms),
               "echo": len(randoms), "outside": len(calibration)}
    return HeadScores({n: total[n] / max(divisor[n], 1) for n in names}, kv_heads, counts)
