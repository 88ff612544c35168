"""How much memory training may take beside the weights: ``memory="keep" | "bounded" | "auto"``.

- ``keep``: the usual step: every block's activations kept for the backward, every gradient kept until the
  optimizer's step (then clipped by the global norm). Peak ≈ weights + gradients (1x the trained weights) +
  optimizer state (2x for AdamW) + activations.
- ``bounded``: each block's activations recomputed in the backward (transformers' gradient checkpointing: only the
  blocks' inputs kept) and each parameter updated in the backward as soon as its gradient is complete
  (``backward_step``: gradients never held together). Peak ≈ weights + optimizer state + the largest gradient +
  the blocks' inputs and one block's activations, for one more forward per step; no gradient accumulation and no
  clipping by the global norm. A causal LM's tied embedding and output head (one matrix, often the largest) gets
  its gradient from the head at the start of the backward and from the token lookup at its end: the lookup's part
  comes as a sparse gradient (the rows of the batch's tokens) added into the head's, not as a second dense
  ``[V, D]`` (``bounded``).
- ``auto``: ``keep`` when the gradients and the optimizer state (3x the trained bytes) fit in ``AUTO_SHARE`` of
  the memory still free on the model's device, else ``bounded``.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator

from torch import nn

from ..errors import HeadwiseError
from ..runtime.into_grad import gradient_into_grad

MEMORY_MODES = ("auto", "keep", "bounded")
AUTO_SHARE = 0.5  # the share of free memory that gradients and optimizer state may take under memory="auto"


def choose_memory(memory: str, model: nn.Module) -> str:
    """``"keep"`` or ``"bounded"`` for ``memory`` (one of ``MEMORY_MODES``) and the trainable parameters of
    ``model``."""
    if memory not in MEMORY_MODES:
        raise HeadwiseError(f"training memory {memory!r} is not one of {', '.join(MEMORY_MODES)}")
    if memory != "auto":
        return memory
    from ..analysis.activations import available_bytes

    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    free = available_bytes(next(model.parameters()).device)
    return "keep" if free is None or 3 * trained <= AUTO_SHARE * free else "bounded"


@contextmanager
def recomputed_blocks(model: nn.Module) -> Iterator[None]:
    """``model``'s blocks recomputed in the backward for the block (transformers' activation checkpointing, the
    non-reentrant form), switched back off after unless it was on already."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise HeadwiseError(f"{type(model).__name__} does not support gradient checkpointing, which memory='bounded' "
                            "uses to recompute its blocks in the backward; train with memory='keep'")
    if is_recomputing(model):
        yield
        return
    # recent transformers name it activation checkpointing (the gradient_checkpointing_* names are deprecated)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        yield
    finally:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()


@contextmanager
def bounded(model: nn.Module) -> Iterator[None]:
    """``memory="bounded"`` for the block: the blocks recomputed (``recomputed_blocks``) and, for a trained embedding
    tied to the output head, one dense ``[V, D]`` gradient in the backward instead of three: the head's loss
    (``tasks.lm.head_losses``) adds its part into ``.grad`` as soon as it has it (``runtime.into_grad``), and
    the token lookup's part comes sparse (``nn.Embedding.sparse``: the batch's rows), added into it in place; the
    update (``backward_step``) follows once both are in. Autograd would otherwise hold the head's part until the
    lookup's dense part arrives and add the two into a third."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = (isinstance(embedding, nn.Embedding) and isinstance(head, nn.Module) and embedding.weight.requires_grad
            and getattr(head, "weight", None) is embedding.weight and not embedding.sparse)
    with recomputed_blocks(model), gradient_into_grad(embedding.weight) if tied else nullcontext():
        if tied:
            embedding.sparse = True
        try:
            yield
        finally:
            if tied:
                embedding.sparse = False


def is_recomputing(model: nn.Module) -> bool:
    """Whether ``model``'s blocks are under transformers' activation (gradient) checkpointing."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
