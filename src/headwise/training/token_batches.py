"""Token-bucketed batches for translation training: pairs of similar length batched together so that a batch holds
at most ``max_tokens`` padded source-or-target tokens (fairseq's ``--max-tokens``)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import HeadwiseError


def token_batches(src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, *,
                  seed: int, epoch: int) -> list[list[int]]:
    """Batches of example indices for one epoch, deterministic in ``(seed, epoch)``.

    Examples are shuffled, stably sorted by ``max(source, target)`` length, cut greedily into batches whose
    ``size × longest side`` stays within ``max_tokens``, and the batch order is shuffled. Every example lands in
    exactly one batch; an example longer than ``max_tokens`` alone is refused.
    """
    if len(src_lengths) != len(tgt_lengths):
        raise HeadwiseError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
    lengths = [max(s, t) for s, t in zip(src_lengths, tgt_lengths)]
    if lengths and max(lengths) > max_tokens:
        raise HeadwiseError(f"an example of {max(lengths)} tokens exceeds max_tokens={max_tokens}; raise max_tokens "
                            "or lower max_length")
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = sorted(torch.randperm(len(lengths), generator=generator).tolist(), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # ascending lengths: the newest example is the longest of its batch
        if current and (len(current) + 1) * lengths[i] > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]
