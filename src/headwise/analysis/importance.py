"""Head importance for every (site, layer) row: Michel et al.'s gradient score and the ablation drop.

Both return ``[rows, H]`` tables (``rows.rows_of`` order; NaN for heads a row does not have) and both put
``RowGate``s (``gates.py``) on the per-head outputs Z, i.e. the Michel mask ξ_h (D.1; for ``Z = A·V`` masking A
or Z is the same). Under ``torch.distributed`` each process passes its own share of the data and the sums are
added over processes before dividing.

**Gradient importance** ``I_h = E|∂L/∂g_h|`` at ``g = 1`` (D.2), with every weight of the model frozen for the
pass (``frozen``: the backward reaches the gates only; no weight gradient is computed or stored), and each block
of the layer stack checkpointed (``checkpointed``: the backward keeps one block's activations at a time) or, at
long context, the decoder layers taken one at a time (``layerwise``), as ``activations.recompute_plan`` fits them.
``abs_scope="batch"`` takes the absolute value of each batch's summed gradient (bertology, with the gradient
zeroed per batch), ``"example"`` of each example's gradient (the paper); the score is the sum of those absolute
values divided by the number of examples (both scopes agree at batch size 1), then each row is divided by its L2
norm (``normalize``). The loss ``L``:

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
embedding fidelity, so the drop is ``mean_b (1 − cos(ê_b, ê_b without head h))``. ``method="layers"``
(default) sweeps the heads one layer at a time: the batch is repeated once per head of the layer (up to
``sweep_batch`` sequences per forward), each copy's ``RowGate`` weights zero its own head, and the layers below
are not run again — their outputs do not depend on the head, so the reference forward's output of the layer
below is fed in, repeated (models whose layers form one stack of blocks returning a tensor, e.g. Llama, BERT,
GPT-2; others run the whole model per forward). One forward per layer and text batch (per ``sweep_batch``
sequences), and on average half the layers' work per ablated head. ``method="batched"``: the same sweep
through the whole model, heads of any layers mixed in a forward; ``method="exact"``: one forward per head,
nothing repeated (the reference the others equal to float tolerance). With ``metric(model) -> float`` (higher
is better) the model is instead evaluated once per head: ``drop = metric(intact) − metric(head zeroed)``; that
path is not reduced across processes.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import HeadwiseError
from .config import ABS_SCOPES
from .gates import row_gates
from ..batching import Batch, pooled, resolve_max_length, text_batches
from ..progress import progress_bar
from ..runtime import eval_mode, using_headwise
from .activations import Recompute, recompute_plan
from .layer_stack import block_stack, chunked_mlps, replaced_forwards
from .layerwise import layerwise
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
                  on_batch: Callable[[Batch], None] | None = None,
                  ) -> Iterator[tuple[int, Callable[[], torch.Tensor]]]:
    """``(batch size, closure returning per-example losses [B])`` for each batch of the chosen objective;
    ``on_batch(batch)`` is called before each text batch's closure (texts only)."""
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
        if on_batch is not None:
            on_batch(batch)
        if loss_fn is not None:
            yield len(batch.index), lambda batch=batch: loss_fn(model, batch.inputs)
        else:
            def projection(batch: Batch = batch) -> torch.Tensor:
                emb = pooled(model, batch.inputs)
                return (emb * _probes(batch.index, emb.shape[-1], seed, emb.device)).sum(-1)

            yield len(batch.index), projection


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    """A block's hidden-state input: its first positional argument or ``hidden_states=``."""
    return args[0] if args else kwargs["hidden_states"]


def _same_call(a: tuple[tuple, dict], b: tuple[tuple, dict]) -> bool:
    """Whether two blocks got the same arguments besides the hidden states (the same objects: masks, rotary
    tables, caches)."""
    (args_a, kw_a), (args_b, kw_b) = a, b
    if len(args_a) != len(args_b) or kw_a.keys() != kw_b.keys():
        return False
    pairs = [*zip(args_a, args_b), *((kw_a[k], kw_b[k]) for k in kw_a)]
    return all(x is y or (not isinstance(x, (torch.Tensor, tuple, list, dict)) and x == y) for x, y in pairs)


def _rest(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block's arguments without its hidden states."""
    return (args[1:], kwargs) if args else ((), {k: v for k, v in kwargs.items() if k != "hidden_states"})


def _segment_forwards(blocks: list[nn.Module]) -> list[Callable]:
    """Forwards for ``blocks`` (consecutive blocks of one stack) that recompute them as one segment: with gradients
    on, the first block's forward runs the whole segment under ``checkpoint``, each block inside under its own
    ``checkpoint``, and returns the segment's output; the later blocks pass it on, after checking that they got the
    arguments the first one did (a model whose blocks get different masks, e.g. sliding-window layers, is refused:
    the segment ran them with the first block's). Without gradients every block runs as before."""
    inners = [block.forward for block in blocks]
    state: dict[str, Any] = {"call": None}

    def first(*args: Any, **kwargs: Any) -> Any:
        state["call"] = None
        if not torch.is_grad_enabled():
            return inners[0](*args, **kwargs)
        if len(inners) == 1:
            return checkpoint(inners[0], *args, use_reentrant=False, **kwargs)
        state["call"] = _rest(args, kwargs)
        rest, kw = state["call"]

        def segment(hidden: torch.Tensor) -> torch.Tensor:
            for inner in inners:
                hidden = checkpoint(inner, hidden, *rest, use_reentrant=False, **kw)
                if not isinstance(hidden, torch.Tensor):
                    raise HeadwiseError(f"{type(blocks[0]).__name__} returns {type(hidden).__name__}, not the hidden "
                                        "states: its blocks cannot be recomputed in segments (use segment=1)")
            return hidden

        return checkpoint(segment, _hidden(args, kwargs), use_reentrant=False)

    def later(index: int) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            if state["call"] is None:
                return inners[index](*args, **kwargs)
            if not _same_call(state["call"], _rest(args, kwargs)):
                raise HeadwiseError(f"{type(blocks[index]).__name__} blocks of this model get different arguments "
                                    "(masks, positions): they cannot be recomputed in segments (use segment=1)")
            return _hidden(args, kwargs)
        return run

    return [first, *(later(i) for i in range(1, len(blocks)))]


@contextmanager
def checkpointed(model: nn.Module, rows: list[Row], plan: Recompute = Recompute()) -> Iterator[None]:
    """The blocks of the model's layer stack (``layer_stack.block_stack``) recomputed in the backward for the block
    (the same gradients; more forwards): each block under ``torch.utils.checkpoint``, so a backward keeps only the blocks'
    inputs and one block's activations at a time; with ``plan.segment = s > 1`` the stack in segments of ``s``
    blocks, each checkpointed whole and every block inside it too, so only the segments' inputs are kept and, while
    one segment is recomputed, its blocks' (``⌈L/s⌉ + s`` hidden states instead of ``L``, one forward more); with
    ``plan.mlp_tokens`` each block's MLP runs over chunks of that many positions, checkpointed (``chunked_mlps``).
    The model runs without a key/value cache (``config.use_cache`` off for the block): a recomputed block would
    append its keys to it a second time. Models without one stack run unchanged."""
    found = block_stack(model, rows)
    if found is None:
        yield
        return
    stack = list(found[0])
    forwards = [f for start in range(0, len(stack), plan.segment)
                for f in _segment_forwards(stack[start : start + plan.segment])]
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    if use_cache:
        config.use_cache = False
    try:
        with replaced_forwards(stack, forwards), chunked_mlps(model, rows, plan.mlp_tokens):
            yield
    finally:
        if use_cache:
            config.use_cache = use_cache


@contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """Every parameter of ``model`` with ``requires_grad=False`` for the block (restored after): a backward to
    the head gates then neither computes nor keeps anything for the weights' gradients (no activations saved for
    them, no ``.grad``)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def gradient_sums(
    model: nn.Module, tokenizer: Any, texts: Sequence[str] | None = None, *, index: Sequence[int] | None = None,
    pairs: Pairs | None = None, loss_fn: LossFn | None = None, batch_size: int = 32, max_length: int | None = None,
    abs_scope: str = "example", seed: int = 0, score_scale: float = 5.0, progress: bool | None = None,
    inputs: Sequence[dict[str, torch.Tensor]] | None = None, cross_attention: bool = False,
    on_batch: Callable[[Batch], None] | None = None, after_forward: Callable[[], None] | None = None,
    seconds: dict[str, float] | None = None, checkpoint_blocks: bool | Recompute = True,
) -> tuple[torch.Tensor, int]:
    """This process's ``(Σ |∂L/∂g| [rows, H] float64 on CPU, number of examples)``; see the module docstring.
    ``inputs``: ready batches (any keys ``loss_fn`` reads, e.g. a task's collated batches) instead of texts;
    ``cross_attention``: also score ``dec-enc`` rows (``rows_of(model, cross_attention=True)`` order);
    ``on_batch(batch)``: called before each text batch's forward and ``after_forward()`` once it is done, before
    its backward (``analyze`` feeds its statistics observers from the forwards, not from the recomputations);
    ``seconds``: ``"forward"`` and ``"backward"`` wall times are added into it; ``checkpoint_blocks``: recompute
    the blocks in the backward (``checkpointed``) as ``activations.recompute_plan`` fits them in the memory margin
    for the longest batch (True), as a given ``Recompute``, or keep every activation (False)."""
    if abs_scope not in ABS_SCOPES:
        raise HeadwiseError(f"unknown abs_scope {abs_scope!r}; use one of {', '.join(ABS_SCOPES)}")
    rows = rows_of(model, cross_attention)
    device, max_length = _device(model), resolve_max_length(model, tokenizer, max_length)
    total = (sum(len(next(iter(b.values()))) for b in inputs) if inputs is not None
             else len(pairs[0]) if pairs is not None else len(texts or ()))
    bar = progress_bar(total=total, desc="gradient importance", unit="sent",
                       disable=None if progress is None else not progress)
    sums, count = None, 0
    if checkpoint_blocks is True:  # the largest batch: ready batches as given, texts and pairs at most this long
        shapes = [b.get("input_ids", next(iter(b.values()))).shape for b in inputs or ()]
        largest = max(shapes, key=lambda shape: shape.numel()) if shapes else None
        batch, length = (batch_size, max_length) if largest is None else (largest[0], largest[1:].numel())
        checkpoint_blocks = recompute_plan(model, rows, batch, length, one_forward=pairs is None)
    by_layer = isinstance(checkpoint_blocks, Recompute) and checkpoint_blocks.layer_tokens is not None
    with using_headwise(model), eval_mode(model), frozen(model), row_gates(model, rows) as gates, \
            (layerwise(model, rows, checkpoint_blocks.layer_tokens) if by_layer
             else checkpointed(model, rows, checkpoint_blocks) if checkpoint_blocks else _nothing()) as layers, \
            torch.enable_grad():
        sums = torch.zeros(len(rows), gates.heads, dtype=torch.float64)
        for size, losses in _loss_batches(model, tokenizer, texts, index, pairs, loss_fn, batch_size, max_length,
                                          seed, score_scale, inputs, on_batch):
            leaf = gates.ones(size if abs_scope == "example" else 1, device).requires_grad_()
            gates.set(leaf)
            start = time.perf_counter()
            total_loss = losses().sum()
            if after_forward is not None:
                after_forward()
            middle = time.perf_counter()
            if by_layer:
                held, total_loss = [total_loss], None
                grad = layers.backward(held, leaf)
            else:
                (grad,) = torch.autograd.grad(total_loss, leaf, allow_unused=True)
            if seconds is not None:
                seconds["forward"] = seconds.get("forward", 0.0) + middle - start
                seconds["backward"] = seconds.get("backward", 0.0) + time.perf_counter() - middle
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


ABLATION_METHODS = ("layers", "batched", "exact")


@contextmanager
def _captured(stack: nn.ModuleList) -> Iterator[list]:
    """Record each block's output during the block (``None`` for an output that is not a tensor)."""
    outputs: list = [None] * len(stack)

    def hook(index: int):
        def record(module, args, output):
            outputs[index] = output if isinstance(output, torch.Tensor) else None
        return record

    handles = [block.register_forward_hook(hook(i)) for i, block in enumerate(stack)]
    try:
        yield outputs
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _from_block(stack: nn.ModuleList, start: int, below: torch.Tensor | None) -> Iterator[None]:
    """Run only blocks ``start..`` of ``stack``: the blocks before pass their input through untouched, and the
    one just below returns ``below`` (its output in the reference forward, repeated for the batch's copies)."""
    if start == 0:
        yield
        return
    def passing(*args, **kwargs):
        return args[0] if args else kwargs["hidden_states"]

    with replaced_forwards(stack[:start], [passing] * (start - 1) + [lambda *args, **kwargs: below]):
        yield


def _sweep_plan(rows: list[Row], copies: int, method: str, blocks: list[int] | None
                ) -> list[tuple[int, list[tuple[int, int]]]]:
    """``[(first block to run, [(row, head) zeroed in each copy])]``: the forwards of one text batch."""
    heads = _heads(rows)
    if method == "exact":
        return [(0, [h]) for h in heads]
    if method == "batched" or blocks is None:
        return [(0, heads[i : i + copies]) for i in range(0, len(heads), copies)]
    out = []
    for row in rows:  # a layer's heads in as few, as even forwards as fit
        mine = [(row.index, h) for h in range(row.site.num_heads)]
        n = -(-len(mine) // copies)
        size = -(-len(mine) // n)
        out += [(blocks[row.index], mine[i : i + size]) for i in range(0, len(mine), size)]
    return out


@torch.no_grad()
def ablation_sums(
    model: nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 32, sweep_batch: int = 256,
    max_length: int | None = None, progress: bool | None = None, method: str = "layers",
) -> tuple[torch.Tensor, int]:
    """This process's ``(Σ_b (1 − cos(ê_b, ê_b without head)) [rows, H] float64 CPU, number of sentences)``;
    ``method``: ``"layers"``, ``"batched"`` or ``"exact"`` (module docstring)."""
    if method not in ABLATION_METHODS:
        raise HeadwiseError(f"unknown ablation method {method!r}; use one of {', '.join(ABLATION_METHODS)}")
    rows = rows_of(model)
    device, max_length = _device(model), resolve_max_length(model, tokenizer, max_length)
    found = block_stack(model, rows) if method == "layers" else None
    stack, blocks = found if found is not None else (None, None)
    bar = progress_bar(total=len(texts), desc="ablation sweep", unit="sent",
                       disable=None if progress is None else not progress)
    count = 0
    with using_headwise(model), eval_mode(model), row_gates(model, rows) as gates:
        sums = torch.zeros(len(rows), gates.heads, dtype=torch.float64)
        for batch in text_batches(tokenizer, texts, min(batch_size, sweep_batch), max_length, device):
            b = len(batch.index)
            gates.set(gates.ones(1, device))
            with _captured(stack) if stack is not None else _nothing() as below:
                reference = pooled(model, batch.inputs)  # [b, D]
            plan = _sweep_plan(rows, max(1, sweep_batch // b), method,
                               blocks if below is not None and all(o is not None for o in below) else None)
            for start, chunk in plan:
                weight = gates.ones(len(chunk) * b, device)
                for c, (row, head) in enumerate(chunk):
                    weight[row, c * b : (c + 1) * b, head] = 0.0
                gates.set(weight)
                repeated = None if start == 0 else below[start - 1].repeat(len(chunk), *[1] * (below[0].dim() - 1))
                with _from_block(stack, start, repeated) if start else _nothing():
                    emb = pooled(model, batch.repeat(len(chunk))).view(len(chunk), b, -1)
                drop = (1.0 - (emb * reference[None]).sum(-1)).sum(1).double().cpu()  # [copies]
                for c, (row, head) in enumerate(chunk):
                    sums[row, head] += drop[c]
            count += b
            bar.update(b)
    bar.close()
    return sums, count


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


@torch.no_grad()
def ablation_importance(
    model: nn.Module, tokenizer: Any = None, texts: Sequence[str] | None = None, *,
    metric: Callable[[nn.Module], float] | None = None, batch_size: int = 32, sweep_batch: int = 256,
    max_length: int | None = None, progress: bool | None = None, method: str = "layers",
) -> torch.Tensor:
    """Drop of a metric when each head alone is zeroed, ``[rows, H]`` (float64, CPU); see the module docstring.

    Default: embedding-fidelity drop over ``texts`` (``method``: ``"layers"`` sweep, ``"batched"`` or
    ``"exact"``). ``metric(model) -> float``: called once intact and once per head with that head zeroed.
    """
    rows = rows_of(model)
    if metric is None:
        if tokenizer is None or texts is None:
            raise HeadwiseError("ablation importance needs a tokenizer and texts, or a metric callable")
        sums, count = reduce_sums(*ablation_sums(model, tokenizer, texts, batch_size=batch_size,
                                                 sweep_batch=sweep_batch, max_length=max_length, progress=progress,
                                                 method=method))
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


__all__ = ["gradient_importance", "ablation_importance", "gradient_sums", "ablation_sums", "reduce_sums",
           "ABLATION_METHODS"]
