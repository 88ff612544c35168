"""``analyze``: one observed pass over a corpus (plus the importance passes asked for) → ``HeadStats``."""

from __future__ import annotations

import inspect
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..contract import with_keywords
from ..errors import HeadwiseError
from ..progress import progress_bar
from ..runtime import eval_mode, using_headwise
from .activations import Recompute, forward_chunk_tokens, keep_activations, recompute_plan
from .attach import observed_call, per_site
from .config import AnalysisConfig
from .importance import LossFn, Pairs, ablation_sums, gradient_sums
from .layer_stack import chunked_layers
from ..batching import Batch, resolve_max_length, text_batches
from .observer import BatchContext, MapRecorder, StatsObserver
from .rows import Row, rows_of
from .stats import HeadStats


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextmanager
def observing(model: nn.Module, rows: list[Row], stats: HeadStats, total: int, progress: bool | None = None
              ) -> Iterator[tuple[Callable[[Batch], None], Callable[[], None]]]:
    """Statistics observers on every site of ``rows`` for the block; yields ``(seen, done)``: ``seen(batch)`` to
    call before each text batch's forward (it tells the observers which tokens are real and counts sentences and
    tokens), ``done()`` after it (later calls, e.g. a backward's recomputation, are not observed)."""
    context = BatchContext()
    bar = progress_bar(total=total, desc="analysing heads", unit="sent",
                       disable=None if progress is None else not progress)

    def seen(batch: Batch) -> None:
        context.set(batch.real, batch.special)
        stats.acc["sentences"] += len(batch.index)
        stats.acc["tokens"] += batch.real.sum().item()
        bar.update(len(batch.index))

    with per_site(model, rows, lambda site, first, n: StatsObserver(stats, context, first, n)):
        yield seen, context.done
    bar.close()


@torch.no_grad()
def observe(model: nn.Module, tokenizer: Any, texts: Sequence[str], rows: list[Row], stats: HeadStats,
            batch_size: int, max_length: int, progress: bool | None = None) -> None:
    """Run ``texts`` through ``model`` with statistics observers attached, adding into ``stats``; at long context
    each decoder layer runs over chunks of query positions (``layer_stack.chunked_layers``; other models' MLPs over
    chunks of positions), ``activations.forward_chunk_tokens`` at a time."""
    device = next(model.parameters()).device
    tokens = forward_chunk_tokens(model, min(batch_size, len(texts)), max_length)
    with observing(model, rows, stats, len(texts), progress) as (seen, _), chunked_layers(model, rows, tokens):
        for batch in text_batches(tokenizer, texts, batch_size, max_length, device):
            seen(batch)
            observed_call(model, batch.inputs)


@torch.no_grad()
def record_examples(model: nn.Module, tokenizer: Any, texts: Sequence[str], rows: list[Row],
                    max_length: int) -> list[dict]:
    """Full maps of a few sentences, each run alone (no padding): ``maps[row][head][i][j]`` = A(query i → key j)."""
    device = next(model.parameters()).device
    examples = []
    for text in texts:
        maps: dict[int, torch.Tensor] = {}
        with per_site(model, rows, MapRecorder.build(maps)):
            batch = next(text_batches(tokenizer, [text], 1, max_length, device), None)
            if batch is None:
                continue
            model(**batch.inputs)
        tokens = tokenizer.convert_ids_to_tokens(batch.input_ids[0].tolist())
        examples.append({"text": text, "tokens": tokens,
                         "maps": [maps[r.index][: r.site.num_heads].round(decimals=5).tolist() for r in rows]})
    return examples


def _gradient_label(plan: Recompute | bool) -> str:
    """The ``seconds`` entry of the backwards: how the gradient pass held its activations."""
    if not plan:
        return "gradient"
    return "gradient (layer by layer)" if plan.layer_tokens is not None else "gradient (blocks recomputed)"


def analyze(model: nn.Module, tokenizer: Any, texts: Sequence[str], config: AnalysisConfig | None = None, *,
            pairs: Pairs | None = None, loss_fn: LossFn | None = None,
            loss_inputs: Sequence[dict[str, torch.Tensor]] | None = None, progress: bool | None = None,
            **options: Any) -> HeadStats:
    """Per-head statistics of ``model`` over ``texts`` (encoders and causal decoders; base models).

    ``config``/``options``: ``AnalysisConfig`` fields (``batch_size=32``, ``max_length=None``, ``thresholds``,
    ``examples=3``, ``importance=("gradient", "ablation")``, ...); an option that conflicts with ``config`` raises.
    ``pairs`` ``(first, second, scores)``: train-objective data for gradient importance (STS-B objective instead of the
    label-free default); ``loss_inputs`` (ready batches) with ``loss_fn(model, batch) -> [B]``: any other
    objective, e.g. a task's loss on its batches (not sharded across processes). Under ``torch.distributed`` process ``r`` of ``n`` takes ``texts[r::n]`` (and pairs
    alike) and the accumulators are summed over processes, so every process returns the same statistics.
    When the gradient's objective runs on ``texts`` themselves (no ``pairs``, no ``loss_inputs``: the random
    projection, or ``loss_fn(model, {"input_ids", "attention_mask"})`` such as a language model's next-token loss
    of the text), statistics and gradient come from one pass: each batch's forward feeds the observers and its
    backward gives the gradient (``seconds``: ``observe`` is then the forwards, ``gradient`` the backwards, named
    ``gradient (blocks recomputed)`` when the blocks' activations were recomputed rather than kept, ``recompute``, and
    ``gradient (layer by layer)`` when ``activations.recompute_plan`` took the decoder layers one at a time,
    ``layerwise``: the statistics then come from its forward without gradients, by chunks of queries).
    The model is put in eval mode and gets the ``headwise`` attention implementation for the call; all observers
    and gates are detached afterwards, also on error.
    """
    if "decoder_input_ids" in inspect.signature(model.forward).parameters:
        raise HeadwiseError(
            f"analyze runs one text input, but {type(model).__name__} is an encoder-decoder: analyse its encoder "
            "with analyze(model.get_encoder(), ...), and every kind (enc-self, dec-self, dec-enc) with "
            "headwise.analysis.head_roles(model, batches)")
    cfg = with_keywords(AnalysisConfig, config, **options)
    texts = list(texts)
    if not texts:
        raise HeadwiseError("no texts to analyse")
    rank, world = _rank_world()
    shard = list(range(rank, len(texts), world))
    rows = rows_of(model)
    max_length = resolve_max_length(model, tokenizer, cfg.max_length)
    name = cfg.model_name or str(getattr(model.config, "_name_or_path", "") or model.config.model_type)
    stats = HeadStats.empty([r.describe() for r in rows], cfg.thresholds, next(model.parameters()).device,
                            model=name, data=cfg.data_name, normalize_importance=cfg.normalize_importance)
    mine = [texts[i] for i in shard]
    # one pass: when the gradient's objective runs on the analysed texts themselves, its forward feeds the
    # statistics observers too (the same text batches, so the same statistics as a separate pass)
    together = "gradient" in cfg.importance and pairs is None and loss_inputs is None
    with using_headwise(model), eval_mode(model):
        start = time.perf_counter()
        if together:
            parts: dict[str, float] = {}
            batch = min(cfg.batch_size, len(mine))
            recompute = cfg.recompute if cfg.recompute is not None else not keep_activations(
                model, rows, batch * max_length)
            plan = recompute_plan(model, rows, batch, max_length) if recompute else False
            with observing(model, rows, stats, len(mine), progress) as (seen, done):
                stats.add_importance_("gradient", *gradient_sums(
                    model, tokenizer, mine, index=shard, loss_fn=loss_fn, batch_size=cfg.batch_size,
                    max_length=max_length, abs_scope=cfg.abs_scope, seed=cfg.seed, progress=False, on_batch=seen,
                    after_forward=done, seconds=parts, checkpoint_blocks=plan))
            stats.seconds["observe"] = parts["forward"]
            stats.seconds[_gradient_label(plan)] = parts["backward"]
        else:
            observe(model, tokenizer, mine, rows, stats, cfg.batch_size, max_length, progress)
            stats.seconds["observe"] = time.perf_counter() - start
        if cfg.examples:
            start = time.perf_counter()
            stats.examples = record_examples(model, tokenizer, texts[: cfg.examples], rows,
                                             min(max_length, cfg.example_tokens))
            stats.seconds["observe"] += time.perf_counter() - start
        if "gradient" in cfg.importance and not together:
            start = time.perf_counter()
            my_pairs = None if pairs is None else tuple([p[i] for i in range(rank, len(p), world)] for p in pairs)
            stats.add_importance_("gradient", *gradient_sums(
                model, tokenizer, mine, index=shard, pairs=my_pairs, batch_size=cfg.batch_size, max_length=max_length,
                abs_scope=cfg.abs_scope, seed=cfg.seed, progress=progress, loss_fn=loss_fn, inputs=loss_inputs))
            stats.seconds["gradient"] = time.perf_counter() - start
        if "ablation" in cfg.importance:
            start = time.perf_counter()
            limit = len(texts) if cfg.ablation_texts is None else cfg.ablation_texts
            stats.add_importance_("ablation", *ablation_sums(
                model, tokenizer, [texts[i] for i in shard if i < limit], batch_size=cfg.batch_size, sweep_batch=cfg.sweep_batch,
                max_length=max_length, progress=progress))
            stats.seconds["ablation"] = time.perf_counter() - start
    return stats.all_reduce_()
