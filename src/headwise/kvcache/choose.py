"""Choose a policy for a KV-memory budget: rank KV heads by their scores, keep the best ones full, stream the rest."""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from ..errors import HeadwiseError
from .natural import natural_texts
from .policy import FULL, KVPolicy, latent_layers, model_shape, streaming
from .scores import NAMES, HeadScores, ScoreConfig, head_scores

# the default: passkey retrieval + fact lookup, each over its largest head. Chosen on the long-context suite's samples
# of seed 1234 at 0.5 × 2048 on SmolLM2 (60 contexts: 27.2 against 24.1 for retrieval alone, qa 29.2 against 26.0,
# full cache 21.8 / 29.2; experiments/kv_lookup_probe.py), judged on seed 4949 (docs/kv-policy.md).
DEFAULT_RANKING = "retrieval+lookup"
# the default's scores + ``outside`` measured on natural text (``natural.natural_texts``: Python's documentation and
# standard-library source, never the judged prose) unless texts are given: keeps full the heads that look past the
# window on natural text, where the synthetic prompts rank them low. Not the default: against it, better on prose
# and code, worse on docs and generated text (issue 68; experiments/results/kv_long_suite_families.md)
NATURAL_RANKING = "retrieval+lookup+outside"
RANKINGS = (DEFAULT_RANKING, NATURAL_RANKING, "combined", *NAMES, "learned", "random")  # and any other sum of scores
GRANULARITIES = ("head", "layer")
# sink + window of a streaming head, as a share of the per-head budget. Chosen on the long-context suite's samples of
# seed 1234 (shares 0.75 / 0.5 / 0.25 / 0.1 at 0.5 × 2048 on SmolLM2: 15.4 / 19.4 / 24.5 / 22.7, full cache 19.8),
# judged on seed 4949 and at 4k (docs/kv-policy.md, "Long-context suite at equal KV bytes"): more full heads keep
# retrieval, at some perplexity (+5.5% against +2.0% for the former 3/4 at 0.5 × 2048; +1.8% against +0.4% at 8k).
WINDOW_SHARE = 0.25


def full_heads_for_budget(num_heads: int, kv_budget: float, context: int, sink: int, window: int,
                          scaled: bool = False) -> int:
    """The most full heads such that the cache after ``context`` tokens holds at most ``kv_budget`` of the full
    cache's bytes (the other heads keep ``min(context, sink + window)`` tokens). ``scaled``: the other heads' window
    scales with the sequence (``streaming(sink, window, context=context)``), and the budget holds at every length
    ``512·2^k`` below ``context`` too, wherever streaming alone can meet it."""
    if not 0 < kv_budget <= 1:
        raise HeadwiseError(f"kv_budget={kv_budget} must be in (0, 1] (the share of the full cache's bytes to keep)")
    rule = streaming(sink, window, context if scaled and window <= context else None)
    lengths = [n for n in (512 << k for k in range(32)) if n < context] if scaled else []
    counts = []
    for length in lengths + [context]:
        streamed = rule.stored(length)
        if streamed >= length:
            counts.append(num_heads)
        elif streamed <= kv_budget * length:
            counts.append(int((kv_budget * num_heads * length - num_heads * streamed) // (length - streamed)))
        elif length == context:
            raise HeadwiseError(f"even with every head streaming, sink {sink} + window {window} keeps "
                                f"{streamed / context:.0%} of a {context}-token cache, above kv_budget={kv_budget}; "
                                "use a smaller window or a longer context")
    return max(0, min(num_heads, *counts))


def default_window(kv_budget: float, context: int, sink: int, share: float = WINDOW_SHARE) -> int:
    """The streaming heads' window when none is given: ``sink + window`` is ``share`` of the per-head budget
    (``share · kv_budget · context``; ``WINDOW_SHARE`` by default), e.g. window 252 at 0.5 × 2048 tokens, where 38 of
    SmolLM2's 90 KV heads stay full."""
    if not 0 < kv_budget <= 1:
        raise HeadwiseError(f"kv_budget={kv_budget} must be in (0, 1] (the share of the full cache's bytes to keep)")
    if not 0 < share <= 1:
        raise HeadwiseError(f"window share={share} must be in (0, 1] (the part of the per-head budget the window "
                            "takes)")
    window = int(kv_budget * context * share) - sink
    if window < 1:
        raise HeadwiseError(f"kv_budget={kv_budget} at {context} tokens leaves no window after {sink} sink tokens; "
                            "give --window, a longer --context or a larger budget")
    return window


def ranking_scores(by: str) -> list[str]:
    """The scores a ranking reads: ``combined``: every training-free score; ``A+B``: A and B (each over its largest
    value, summed); a score's name: that score; ``random``: none."""
    if by == "random":
        return []
    parts = list(NAMES) if by == "combined" else by.split("+")
    if by not in RANKINGS and not (len(parts) > 1 and all(p in NAMES for p in parts)):
        raise HeadwiseError(f"unknown ranking {by!r}; use one of {', '.join(RANKINGS)}, or a sum of scores such as "
                            f"'copy+lookup' (scores: {', '.join(NAMES)})")
    return parts


def needs_text(ranking: str) -> bool:
    """Whether ``ranking`` reads ``outside``, which needs calibration text longer than the streaming window."""
    return "outside" in ranking_scores(ranking)


def rank_kv_heads(scores: HeadScores, by: str = DEFAULT_RANKING, seed: int = 0) -> list[tuple[int, int]]:
    """``(layer, kv_head)`` from most to least needing the full cache: by the sum of ``ranking_scores(by)``, each
    divided by its largest value (``combined``: the training-free scores computed; ``learned``: the gates of
    ``headwise.training.train_kv_gates``); ``random``: a seeded shuffle (a baseline)."""
    names = ranking_scores(by)
    layers, heads = len(scores.kv_heads), scores.kv_heads[0]
    pairs = [(l, h) for l in range(layers) for h in range(heads)]
    if by == "random":
        random.Random(seed).shuffle(pairs)
        return pairs
    if by == "combined":
        names = [n for n in scores.scores if n != "learned"]
        if not names:
            raise HeadwiseError("ranking by 'combined' needs the training-free scores (head_scores); these scores "
                                "hold only 'learned': rank by 'learned'")
    missing = [n for n in names if n not in scores.scores]
    if missing:
        raise HeadwiseError(f"ranking by {by!r} needs the score(s) {', '.join(missing)}; not computed (outside needs "
                            "texts; lookup needs ScoreConfig.facts > 0; learned needs the scores of "
                            "headwise.training.train_kv_gates)")
    value = sum(s / s.max().clamp(min=1e-12) for s in (scores.kv(n) for n in names))
    order = torch.argsort(value.flatten(), descending=True, stable=True).tolist()
    return [pairs[i] for i in order]


def calibration_length(ranking: str, sink: int, window: int) -> int:
    """Tokens per calibration prompt: 512, or twice ``sink + window`` when the ranking uses ``outside`` (the mass a
    streaming head drops needs prompts well past its window)."""
    return max(512, 2 * (sink + window)) if needs_text(ranking) else 512


def text_length(sink: int, window: int) -> int:
    """Tokens per calibration text of ``outside``: 1,024, or four times ``sink + window`` (three quarters of the
    queries then drop something)."""
    return max(1024, 4 * (sink + window))


def calibrate(model: nn.Module, tokenizer: Any, ranking: str, sink: int, window: int, texts: list[str] | None = None,
              config: ScoreConfig | None = None, progress: bool = True) -> HeadScores:
    """The training-free head scores for ``ranking`` with streaming heads of ``sink + window`` tokens (``config``
    None: prompts of ``calibration_length`` tokens, texts of ``text_length``). A ranking that reads ``outside``
    measures it on ``texts`` (None: ``natural_texts``, two passages each of Python's documentation and
    standard-library source, never the long-context check's prose); ``texts`` is also the running text of a
    ``text`` prompt family."""
    config = config or ScoreConfig(length=calibration_length(ranking, sink, window),
                                   text_length=text_length(sink, window), sink=sink, window=window)
    outside = None
    if needs_text(ranking):
        outside = texts if texts is not None else natural_texts(tokenizer, config.text_length or config.length,
                                                                seed=config.seed)
    return head_scores(model, tokenizer, config, texts=outside, progress=progress,
                       haystack_text="\n".join(texts) if texts else None)


def kv_policy(model: nn.Module, tokenizer: Any, kv_budget: float = 0.5, context: int = 2048, sink: int = 4,
              window: int | None = None, ranking: str = DEFAULT_RANKING, texts: list[str] | None = None,
              config: ScoreConfig | None = None, scores: HeadScores | None = None,
              progress: bool = True, scaled: bool = True, granularity: str = "head",
              seed: int = 0) -> tuple[KVPolicy, HeadScores]:
    """Score the heads (or reuse ``scores``), keep the top-ranked KV heads full and give the others
    ``streaming(sink, window, context)``, as many full heads as fit ``kv_budget`` at ``context`` tokens.

    ``window`` defaults to ``default_window(kv_budget, context, sink)`` (252 at 0.5 × 2048); ``ranking`` to
    ``DEFAULT_RANKING``, passkey retrieval + fact lookup (``rank_kv_heads``; the scores come from ``calibrate``:
    rankings that read ``outside``, such as ``NATURAL_RANKING``, measure it on ``texts``, by default on Python's
    documentation and standard-library source). ``scaled`` (default): the streaming window scales with the sequence
    and reaches ``window`` at ``context``, so the policy keeps about ``kv_budget`` of the bytes at every length
    (``policy.describe()``); ``scaled=False``: a fixed window, which saves less on shorter sequences.

    ``ranking="learned"`` ranks by DuoAttention-style gates instead of the training-free scores: pass
    ``scores=headwise.training.train_kv_gates(model, tokenizer, KVGateConfig(sink=sink, window=window)).scores(H)``
    (the gates' sink and window must be the policy's).

    ``granularity="layer"`` keeps whole layers full or streamed (the only granularity today's serving engines
    support), ranked by their best-ranked KV head, as many as fit the budget; a latent-converted model
    (``convert_latent``: a layer's KV heads share one cached latent) always gets that. ``seed``: the shuffle of
    ``ranking="random"``.

    Returns ``(policy, scores)``; apply with ``headwise.apply_kv_policy(model, policy)``.
    """
    if granularity not in GRANULARITIES:
        raise HeadwiseError(f"granularity={granularity!r}: use one of {', '.join(GRANULARITIES)}")
    window = default_window(kv_budget, context, sink) if window is None else window
    scaled = scaled and window <= context
    shape = model_shape(model)
    if len(set(shape)) != 1:
        raise HeadwiseError(f"layers have different KV head counts {shape}; rank heads per layer by hand")
    per_layer = granularity == "layer" or bool(latent_layers(model))
    n_full = full_heads_for_budget(len(shape) if per_layer else sum(shape), kv_budget, context, sink, window, scaled)
    if ranking == "learned":
        if scores is None:
            raise HeadwiseError("ranking='learned' needs the gates' scores: scores=headwise.training.train_kv_gates("
                                "model, tokenizer, KVGateConfig(sink=sink, window=window)).scores(num_heads)")
    elif scores is None and ranking != "random":
        scores = calibrate(model, tokenizer, ranking, sink, window, texts, config, progress)
    if scores is None:
        scores = HeadScores({}, shape)
    order = rank_kv_heads(scores, ranking, seed)
    other = streaming(sink, window, context if scaled else None)
    if per_layer:
        layers = list(dict.fromkeys(layer for layer, _ in order))[:n_full]
        rules = [FULL if layer in layers else other for layer in range(len(shape))]
        return KVPolicy(tuple((rule,) * n for rule, n in zip(rules, shape))), scores
    return KVPolicy.keep_full(model, set(order[:n_full]), sink, window, other.context), scores
