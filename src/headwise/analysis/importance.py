"""Head importance for every (site, layer) row: Michel et al.'s gradient score and the ablation drop.

Both return ``[rows, H]`` tables (``rows.rows_of`` order; NaN for heads a row does not have) and both put
``RowGate``s (``gates.py``) on the per-head outputs Z, i.e. the Michel mask ξ_h (D.1; for ``Z = A·V`` masking A
or Z is the same). Under ``torch.distributed`` each process passes its own share of the data and the sums are
added over processes before dividing.

**Gradient importance** ``I_h = E|∂L/∂g_h|`` at ``g = 1`` (D.2). ``abs_scope="batch"`` takes the absolute value
of each batch's summed gradient (bertology, with the gradient zeroed per batch), ``"example"`` of each example's
gradient (the paper); the score is the sum of those absolute values divided by the number of examples (both
scopes agree at batch size 1), then each row is divided by its L2 norm (``normalize``). The loss ``L``:

- ``loss_fn(model, inputs) -> [B]`` per-example losses, if given (e.g. a task loss, as in Michel et al.);
- with ``pairs=(first, second, scores)``: the STS-B training objective
  ``(cos(u, v) − score / score_scale)²`` on mean-pooled embeddings;
- otherwise a label-free *random projection* objective ``L_b = r_b · ê_b``, where ``ê_b`` is the unit-norm
  mean-pooled embedding of sentence ``b`` and ``r_b ~ N(0, I)`` a probe seeded by ``(seed, sentence index)``.
  Fidelity to the unmodified model has zero gradient at ``g = 1`` (it is a maximum), and the embedding norm is
  invisible to cosine similarity, so neither measures anything. ``E_r |r · J| = sqrt(2/π) ‖J‖`` for the
  Jacobian ``J = ∂ê_b/∂g_h``, so with ``abs_scope="example"`` the score estimates ``‖∂ê/∂g_h‖``, the first-order
  size of the change of the embedding's direction when the head is scaled — and ``1 − cos`` after removing the
  head is ``≈ ½‖∂ê/∂g_h‖²``, which ties it to the ablation score below.

**Ablation importance**: the drop of a metric when one head alone is zeroed. By default the metric is
embedding fidelity, so the drop is ``mean_b (1 − cos(ê_b, ê_b without head h))``. All heads are swept in
batches: the batch is repeated once per (row, head) being zeroed, up to ``sweep_batch`` sequences per forward,
and each copy's ``RowGate`` weights zero its own head. With ``metric(model) -> float`` (higher is better) the
model is instead evaluated once per head: ``drop = metric(intact) − metric(head zeroed)``; that path is not
reduced across processes.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from .config import ABS_SCOPES
from .gates import row_gates
from ..batching import Batch, pooled, resolve_max_length, text_batches
from ..progress import progress_bar
from ..runtime import eval_mode, using_headwise
from .rows import Row, rows_of

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
Pairs = tuple[Sequence[str], Sequence[str], Sequence[float]]


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _mask_missing(table: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    heads = torch.tensor([r.site.num_heads for r in rows])
    table[torch.arange(table.shape[1])[None, :] >= heads[:, None]] = float("nan")
    return table


def reduce_sums(sums: torch.Tensor, count: float) -> tuple[torch.Tensor, float]:
    """Sum ``sums`` and ``count`` over ``torch.distributed`` processes (unchanged when not initialised)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return sums, count
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    packed = torch.cat([sums.flatten(), torch.tensor([float(count)], dtype=sums.dtype)]).to(device)
    dist.all_reduce(packed)
    packed = packed.cpu()
    return packed[:-1].view_as(sums), packed[-1].item()


def _probes(index: Sequence[int], dim: int, seed: int, device: torch.device) -> torch.Tensor:
    """One ``N(0, I)`` vector per sentence, seeded by ``(seed, sentence index)`` so any sharding draws the same."""
    return torch.stack([torch.randn(dim, generator=torch.Generator().manual_seed(seed * 1_000_003 + i))
                        for i in index]).to(device)


def _loss_batches(model: nn.Module, tokenizer: Any, texts: Sequence[str] | None, index: Sequence[int] | None,
                  pairs: Pairs | None, loss_fn: LossFn | None, batch_size: int, max_length: int, seed: int,
                  score_scale: float, inputs: Sequence[dict[str, torch.Tensor]] | None = None,
                  ) -> Iterator[tuple[int, Callable[[], torch.Tensor]]]:
    """``(batch size, closure returning per-example losses [B])`` for each batch of the chosen objective."""
    device = _device(model)
    if inputs is not None:
        if loss_fn is None:
            raise HeadwiseError("gradient importance over ready batches needs loss_fn(model, batch) -> [B]")
        for batch in inputs:
            batch = {k: v.to(device) for k, v in batch.items()}
            yield len(next(iter(batch.values()))), lambda batch=batch: loss_fn(model, batch)
        return
    if pairs is not None:
        first, second, scores = pairs
        if not len(first) == len(second) == len(scores):
            raise HeadwiseError("pairs must be three sequences of the same length (first, second, scores)")
        for start in range(0, len(first), batch_size):
            span = range(start, min(start + batch_size, len(first)))
            a = next(text_batches(tokenizer, [first[k] for k in span], len(span), max_length, device, sort=False))
            b = next(text_batches(tokenizer, [second[k] for k in span], len(span), max_length, device, sort=False))
            if len(a.index) != len(span) or len(b.index) != len(span):
                raise HeadwiseError("a sentence of a pair tokenises to nothing")
            gold = torch.tensor([float(scores[k]) for k in span], device=device) / score_scale

            def sts(a: Batch = a, b: Batch = b, gold: torch.Tensor = gold) -> torch.Tensor:
                cos = (pooled(model, a.inputs) * pooled(model, b.inputs)).sum(-1)
                return (cos - gold) ** 2

            yield len(span), sts
        return
    if texts is None:
        raise HeadwiseError("gradient importance needs texts or pairs")
    for batch in text_batches(tokenizer, texts, batch_size, max_length, device, index=index):
        if loss_fn is not None:
            yield len(batch.index), lambda batch=batch: loss_fn(model, batch.inputs)
        else:
            def projection(batch: Batch = batch) -> torch.Tensor:
                emb = pooled(model, batch.inputs)
                return (emb * _probes(batch.index, emb.shape[-1], seed, emb.device)).sum(-1)

            yield len(batch.index), projection


def gradient_sums(
    model: nn.Module, tokenizer: Any, texts: Sequence[str] | None = None, *, index: Sequence[int] | None = None,
    pairs: Pairs | None = None, loss_fn: LossFn | None = None, batch_size: int = 32, max_length: int | None = None,
    abs_scope: str = "example", seed: int = 0, score_scale: float = 5.0, progress: bool | None = None,
    inputs: Sequence[dict[str, torch.Tensor]] | None = None, cross_attention: bool = False,
) -> tuple[torch.Tensor, int]:
    """This process's ``(Σ |∂L/∂g| [rows, H] float64 on CPU, number of examples)``; see the module docstring.
    ``inputs``: ready batches (any keys ``loss_fn`` reads, e.g. a task's collated batches) instead of texts;
    ``cross_attention``: also score ``dec-enc`` rows (``rows_of(model, cross_attention=True)`` order)."""
    if abs_scope not in ABS_SCOPES:
        raise HeadwiseError(f"unknown abs_scope {abs_scope!r}; use one of {', '.join(ABS_SCOPES)}")
    rows = rows_of(model, cross_attention)
    device, max_length = _device(model), resolve_max_length(model, tokenizer, max_length)
    total = (sum(len(next(iter(b.values()))) for b in inputs) if inputs is not None
             else len(pairs[0]) if pairs is not None else len(texts or ()))
    bar = progress_bar(total=total, desc="gradient importance", unit="sent",
                       disable=None if progress is None else not progress)
    sums, count = None, 0
    with using_headwise(model), eval_mode(model), row_gates(model, rows) as gates, torch.enable_grad():
        sums = torch.zeros(len(rows), gates.heads, dtype=torch.float64)
        for size, losses in _loss_batches(model, tokenizer, texts, index, pairs, loss_fn, batch_size, max_length,
                                          seed, score_scale, inputs):
            leaf = gates.ones(size if abs_scope == "example" else 1, device).requires_grad_()
            gates.set(leaf)
            (grad,) = torch.autograd.grad(losses().sum(), leaf, allow_unused=True)
            if grad is not None:
                sums += grad.detach().abs().sum(1).double().cpu()
            count += size
            bar.update(size)
    bar.close()
    return sums, count


def gradient_importance(
    model: nn.Module, tokenizer: Any, texts: Sequence[str] | None = None, *, pairs: Pairs | None = None,
    loss_fn: LossFn | None = None, batch_size: int = 32, max_length: int | None = None, abs_scope: str = "example",
    normalize: bool = True, seed: int = 0, score_scale: float = 5.0, progress: bool | None = None,
    inputs: Sequence[dict[str, torch.Tensor]] | None = None, cross_attention: bool = False,
) -> torch.Tensor:
    """Michel et al. gradient importance ``[rows, H]`` (float64, CPU); see the module docstring.

    ``loss_fn(model, {"input_ids", "attention_mask"}) -> [B]`` per-example losses (optional);
    ``pairs=(first, second, gold scores)`` selects the STS-B objective (scores divided by ``score_scale``);
    ``inputs`` (ready batches) with ``loss_fn(model, batch) -> [B]`` any other objective, e.g. a task's loss
    (an encoder-decoder's label loss; ``cross_attention=True`` adds the ``dec-enc`` rows).
    """
    sums, count = gradient_sums(model, tokenizer, texts, pairs=pairs, loss_fn=loss_fn, batch_size=batch_size,
                                max_length=max_length, abs_scope=abs_scope, seed=seed, score_scale=score_scale,
                                progress=progress, inputs=inputs, cross_attention=cross_attention)
    sums, count = reduce_sums(sums, count)
    table = sums / count
    if normalize:
        table = table / (table.norm(dim=1, keepdim=True) + 1e-20)
    return _mask_missing(table, rows_of(model, cross_attention))


def _heads(rows: list[Row]) -> list[tuple[int, int]]:
    """Every (row, head) pair, in table order."""
    return [(r.index, h) for r in rows for h in range(r.site.num_heads)]


@torch.no_grad()
def ablation_sums(
    model: nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 32, sweep_batch: int = 256,
    max_length: int | None = None, progress: bool | None = None,
) -> tuple[torch.Tensor, int]:
    """This process's ``(Σ_b (1 − cos(ê_b, ê_b without head)) [rows, H] float64 CPU, number of sentences)``."""
    rows = rows_of(model)
    device, max_length = _device(model), resolve_max_length(model, tokenizer, max_length)
    bar = progress_bar(total=len(texts), desc="ablation sweep", unit="sent",
                       disable=None if progress is None else not progress)
    count = 0
    with using_headwise(model), eval_mode(model), row_gates(model, rows) as gates:
        sums = torch.zeros(len(rows), gates.heads, dtype=torch.float64)
        heads = _heads(rows)
        for batch in text_batches(tokenizer, texts, min(batch_size, sweep_batch), max_length, device):
            b = len(batch.index)
            gates.set(gates.ones(1, device))
            reference = pooled(model, batch.inputs)  # [b, D]
            copies = max(1, sweep_batch // b)
            for start in range(0, len(heads), copies):
                chunk = heads[start : start + copies]
                weight = gates.ones(len(chunk) * b, device)
                for c, (row, head) in enumerate(chunk):
                    weight[row, c * b : (c + 1) * b, head] = 0.0
                gates.set(weight)
                emb = pooled(model, batch.repeat(len(chunk))).view(len(chunk), b, -1)
                drop = (1.0 - (emb * reference[None]).sum(-1)).sum(1).double().cpu()  # [copies]
                for c, (row, head) in enumerate(chunk):
                    sums[row, head] += drop[c]
            count += b
            bar.update(b)
    bar.close()
    return sums, count


@torch.no_grad()
def ablation_importance(
    model: nn.Module, tokenizer: Any = None, texts: Sequence[str] | None = None, *,
    metric: Callable[[nn.Module], float] | None = None, batch_size: int = 32, sweep_batch: int = 256,
    max_length: int | None = None, progress: bool | None = None,
) -> torch.Tensor:
    """Drop of a metric when each head alone is zeroed, ``[rows, H]`` (float64, CPU); see the module docstring.

    Default: embedding-fidelity drop over ``texts`` (batched sweep). ``metric(model) -> float``: called once
    intact and once per head with that head zeroed.
    """
    rows = rows_of(model)
    if metric is None:
        if tokenizer is None or texts is None:
            raise HeadwiseError("ablation importance needs a tokenizer and texts, or a metric callable")
        sums, count = reduce_sums(*ablation_sums(model, tokenizer, texts, batch_size=batch_size,
                                                 sweep_batch=sweep_batch, max_length=max_length, progress=progress))
        return _mask_missing(sums / count, rows)
    device = _device(model)
    with using_headwise(model), eval_mode(model), row_gates(model, rows) as gates:
        base = float(metric(model))
        table = torch.zeros(len(rows), gates.heads, dtype=torch.float64)
        heads = _heads(rows)
        for row, head in progress_bar(heads, desc="ablation", unit="head",
                                      disable=None if progress is None else not progress):
            weight = gates.ones(1, device)
            weight[row, 0, head] = 0.0
            gates.set(weight)
            table[row, head] = base - float(metric(model))
    return _mask_missing(table, rows)


__all__ = ["gradient_importance", "ablation_importance", "gradient_sums", "ablation_sums", "reduce_sums"]
