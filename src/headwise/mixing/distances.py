"""Head-to-head cosine similarity and L2 distance of the per-head outputs, before and after mixing (MHR §5.3).

For each site with a mixer and each sentence, ``z_h = vec(Z[real positions, h, :])``; ``before`` uses ``Z``
entering the mixer, ``after`` the mixed ``Z'``. Matrices ``[H, H]`` are per-sentence values averaged over
sentences. Cosine is plain ``cos`` in ``[-1, 1]`` (MHR stored ``1 + cos``). Summaries follow the paper: the mean
off-diagonal entry and the entry-wise L1,1 norm. A plain model can be measured by attaching identity mixers
(``add_mixers``), which change nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..batching import resolve_max_length, text_batches
from ..errors import HeadwiseError
from ..io import json_text
from ..runtime import eval_mode
from .alpha import mixers_of

SCHEMA = 1


def pairwise(z: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``z[B, T, H, d]``, ``real[B, T]`` → per-sentence ``(cosine, l2)``, each ``[B, H, H]`` (float64)."""
    flat = (z.double() * real[:, :, None, None]).transpose(1, 2).flatten(2)  # [B, H, T·d]
    unit = F.normalize(flat, dim=-1)
    return unit @ unit.transpose(1, 2), torch.cdist(flat, flat)


def _summary(m: torch.Tensor) -> dict[str, float]:
    off = ~torch.eye(m.shape[0], dtype=torch.bool)
    return {"mean_off_diagonal": float(m[off].mean()), "l11": float(m.abs().sum())}


@torch.no_grad()
def head_distances(model: nn.Module, tokenizer: Any, texts: Sequence[str], batch_size: int = 32,
                   max_length: int | None = 128) -> dict[str, Any]:
    """JSON-ready ``{"headwise_mixing_distances": 1, "sentences": N, "sites": {name: {"kind",
    "before"|"after": {"cosine": [[H] H], "l2": [[H] H], "summary": {"cosine"|"l2": {...}}}}}}``."""
    found = mixers_of(model)
    if not found:
        raise HeadwiseError("head_distances measures around alpha mixers; attach them first (add_mixers)")
    device = next(model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    real_now: list[torch.Tensor] = []

    def hook(name: str):
        def record(_module, args, out):
            sims = torch.stack([*pairwise(args[0], real_now[0]), *pairwise(out, real_now[0])]).sum(1)
            sums[name] = sums.get(name, 0) + sims.cpu()
        return record

    handles = [m.register_forward_hook(hook(s.name)) for s, m in found]
    n = 0
    try:
        with eval_mode(model):
            for batch in text_batches(tokenizer, list(texts), batch_size, resolve_max_length(model, tokenizer, max_length),
                                 device):
                real_now[:] = [batch.real]
                model(**batch.inputs)
                n += len(batch.index)
    finally:
        for h in handles:
            h.remove()
    if not n:
        raise HeadwiseError("no texts to measure")
    out: dict[str, Any] = {"headwise_mixing_distances": SCHEMA, "sentences": n, "sites": {}}
    for site, _ in found:
        if site.name not in sums:
            raise HeadwiseError(f"the mixer of {site.name} never ran; select the headwise attention first "
                                "(headwise.enable(model))")
        cos_b, l2_b, cos_a, l2_a = sums[site.name] / (n * len(site.layers))  # a shared module runs once per layer
        out["sites"][site.name] = {"kind": site.kind, **{
            when: {"cosine": cos.tolist(), "l2": l2.tolist(),
                   "summary": {"cosine": _summary(cos), "l2": _summary(l2)}}
            for when, cos, l2 in (("before", cos_b, l2_b), ("after", cos_a, l2_a))}}
    return out


def save_json(doc: dict[str, Any], path: str | Path) -> Path:
    """Write a JSON document (alphas, distances) to ``path``, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json_text(doc, str(path), indent=1))
    return path
