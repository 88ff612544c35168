"""EVA (Zheng et al., ICLR 2023): exact softmax in a local window plus one control-variate summary per chunk.

Keys outside a query's window block are grouped into chunks of ``c`` tokens. Chunk ``j`` is summarised with
self-normalised importance weights ``p_m ∝ exp(ω_jᵀk_m)`` (proposal ``ω_j``: the mean scaled query of the chunk,
the mean scaled key for ``proposal="key"`` (what cached generation in a model can rebuild: it keeps no past
queries), or 0 for ``proposal="uniform"``) into a key ``k̃_j = Σ p_m k_m``, a value ``β_j = Σ p_m v_m`` and a
log-mass offset ``H_j = logsumexp(ω_jᵀk) − Σ p_m ω_jᵀk_m`` (the entropy of ``p``), so that
``log Σ_m exp(sᵀk_m)`` is estimated by ``sᵀk̃_j + H_j`` (exact when ``ω_j`` equals the query). Each query takes
one softmax over its window keys and the chunk scores, and mixes window values and ``β``.

The window is counted in whole chunks (``window`` rounded up to a multiple of ``c``); blocks of that
many tokens attend to themselves exactly (causal: to earlier tokens of the block) and to the summaries of the chunks
of other blocks (causal: of earlier blocks). ``chunk_size`` fixes ``c`` (cost O(T·(w + T/c)), what decoding needs);
``num_chunks`` fixes their number (``c = ceil(T / num_chunks)``, cost O(T·(w + C))). Padding to whole blocks is
masked, so any length works.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange

from ..errors import HeadwiseError
from .base import Mechanism, MechanismConfig, State, ceil_div, keep_or_ones, neg_fill, pad_to, positive, register


BIAS_BUDGET = 1 << 24  # elements of the additive bias built per fused call (64 MB in float32)
PROPOSALS = ("query", "key", "uniform")
EXTRA = 8  # extra key dimensions that carry the chunk offsets H into SDPA


@dataclass
class EVAConfig(MechanismConfig):
    window: int = field(default=128, metadata={"help": "tokens attended exactly (rounded up to whole chunks)"})
    num_chunks: int = field(default=64, metadata={"help": "number of chunks C (used when chunk_size is 0)"})
    chunk_size: int = field(default=0, metadata={"help": "tokens per chunk c (0: ceil(T / num_chunks))"})
    proposal: str = field(default="query", metadata={"help": "chunk proposal: query (mean chunk query), key (mean "
                                                             "chunk key) or uniform", "choices": PROPOSALS})

    def check(self) -> None:
        positive("window", self.window)
        positive("num_chunks", self.num_chunks)
        positive("chunk_size", self.chunk_size, 0)
        if self.proposal not in PROPOSALS:
            raise HeadwiseError(f"eva: proposal must be one of {', '.join(PROPOSALS)}, got {self.proposal!r}")


def summarise(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
              proposal: str, scale: float) -> tuple[torch.Tensor, ...]:
    """Chunk summaries from ``[B, H, n, c, d]`` chunks (``q`` already scaled) and ``keep [B, 1, n, c]``.

    Returns ``k̃ [B, H, n, d]``, ``β [B, H, n, d]``, ``H [B, H, n]`` and chunk validity ``[B, 1, n]``.
    """
    w = keep.to(q.dtype)
    count = w.sum(-1)
    if proposal == "uniform":
        logits = torch.zeros_like(k[..., 0])
    else:
        source = q if proposal == "query" else k * scale
        omega = (source * w[..., None]).sum(-2) / count.clamp_min(1)[..., None]
        logits = torch.einsum("bhncd,bhnd->bhnc", k, omega)
    logits = logits.masked_fill(~keep, neg_fill(q.dtype))
    p = logits.softmax(-1)
    valid = count > 0
    # padded entries contribute p·logit = 0 (0 · the mask fill would give NaN gradients); empty chunks get H = 0
    entropy = torch.logsumexp(logits, -1) - (p * logits.masked_fill(~keep, 0)).sum(-1)
    entropy = entropy.masked_fill(~valid, 0)
    return torch.einsum("bhnc,bhncd->bhnd", p, k), torch.einsum("bhnc,bhncd->bhnd", p, v), entropy, valid


def mix(local_scores: torch.Tensor, local_values: torch.Tensor, chunk_scores: torch.Tensor,
        beta: torch.Tensor) -> torch.Tensor:
    """One softmax over ``[..., q, w]`` window scores and ``[..., q, n]`` chunk scores; values ``[..., w, d]``,
    ``β [..., n, d]``."""
    probs = torch.cat([local_scores, chunk_scores], dim=-1).softmax(-1)
    w = local_scores.shape[-1]
    return probs[..., :w] @ local_values + probs[..., w:] @ beta


@register
class EVA(Mechanism):
    """Window softmax + control-variate chunk summaries; causal or not, with a decoding cache."""

    name = "eva"
    config_class = EVAConfig
    complexity = "O(T (w + C) d); chunk_size c: O(T (w + T/c) d)"

    def uses_past_queries(self) -> bool:
        return self.config.proposal == "query"

    def sizes(self, t: int) -> tuple[int, int]:
        """Chunk size ``c`` and window block ``W`` (a multiple of ``c``) for length ``t``."""
        c = self.config.chunk_size or ceil_div(t, self.config.num_chunks)
        return c, ceil_div(self.config.window, c) * c

    def attend(self, q, k, v, keep, causal, scale):
        b, h, t, d = q.shape
        c, big = self.sizes(t)
        big = min(big, ceil_div(t, c) * c)
        keep = pad_to(keep_or_ones(keep, q), big, 1)
        q, k, v = (pad_to(x, big, 2) for x in (q, k, v))
        blocks, per = q.shape[2] // big, big // c

        chunks = (rearrange(x, "b h (n c) d -> b h n c d", c=c) for x in (q * scale, k, v))
        kt, beta, entropy, valid = summarise(*chunks, rearrange(keep, "b (n c) -> b n c", c=c)[:, None],
                                             self.config.proposal, scale)
        n = kt.shape[2]
        rows = torch.arange(big, device=q.device)
        local_ok = rearrange(keep, "b (n w) -> b n w", w=big)[:, :, None, None, :] | (rows[:, None] == rows[None])
        if causal:
            local_ok = local_ok & (rows[None, :] <= rows[:, None])
        local_bias = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~local_ok, float("-inf"))
        owner = torch.arange(n, device=q.device) // per  # block of each chunk
        here = torch.arange(blocks, device=q.device)[:, None]
        chunk_ok = valid[:, 0, None, :] & (owner[None] < here if causal else owner[None] != here)  # [b, blocks, n]
        chunk_bias = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~chunk_ok, float("-inf"))
        chunk_bias = chunk_bias[:, :, None, None, :]  # [b, blocks, 1, 1, n]
        # H enters through one extra key dimension (queries carry a 1 there, window keys a 0, summaries H), so its
        # gradient is exact and the mask stays constant (SDPA keeps its fused kernel); 8 extra dims keep alignment
        extra = torch.zeros(*q.shape[:-1], EXTRA, dtype=q.dtype, device=q.device)
        q_aug = torch.cat([q * scale, extra[..., :1] + 1, extra[..., 1:]], dim=-1)
        k_aug = torch.cat([k, extra], dim=-1)
        kt_aug = torch.cat([kt, entropy[..., None], extra[:, :, :n, 1:]], dim=-1)

        # one fused softmax per block over [its own keys, the chunk summaries it may see];
        # blocks go in groups so the mask stays small, and causal groups stop at the last summary they use
        group = max(1, BIAS_BUDGET // (h * big * (big + n)))
        outs = []
        for start in range(0, blocks, group):
            stop = min(blocks, start + group)
            m = min(n, (stop - 1) * per) if causal else n
            g = stop - start
            span = slice(start * big, stop * big)
            flat = lambda x: rearrange(x[:, :, span], "b h (g w) e -> (b g) h w e", w=big)  # noqa: E731
            keys = torch.cat([flat(k_aug), kt_aug[:, None, :, :m].expand(b, g, h, m, d + EXTRA).flatten(0, 1)],
                             dim=2)
            values = torch.cat([flat(v), beta[:, None, :, :m].expand(b, g, h, m, d).flatten(0, 1)], dim=2)
            bias = torch.cat([local_bias[:, start:stop].expand(b, g, 1, big, big),
                              chunk_bias[:, start:stop, :, :, :m].expand(b, g, 1, big, m)], dim=-1)
            out = F.scaled_dot_product_attention(flat(q_aug), keys, values, attn_mask=bias.flatten(0, 1), scale=1.0)
            outs.append(rearrange(out, "(b g) h w e -> b h (g w) e", b=b))
        return torch.cat(outs, dim=2)[:, :, :t]

    def decode(self, q, k, v, keep, state: State, scale):
        """Keeps the current window block (< W tokens) and one summary per finished chunk."""
        if not self.config.chunk_size:
            raise HeadwiseError("eva: decoding needs a fixed chunk_size (num_chunks depends on the final length)")
        c, big = self.sizes(0)
        keep = keep_or_ones(keep, q)
        outs, start = [], 0
        while start < q.shape[2]:
            held = state["k"].shape[2] if "k" in state else 0
            stop = min(q.shape[2], start + big - held)
            outs.append(self._decode_piece(q[:, :, start:stop] * scale, k[:, :, start:stop], v[:, :, start:stop],
                                           keep[:, start:stop], state, c, big, scale))
            start = stop
        return torch.cat(outs, dim=2)

    def _decode_piece(self, q, k, v, keep, state: State, c: int, big: int, scale: float) -> torch.Tensor:
        for name, new in (("q", q), ("k", k), ("v", v), ("keep", keep)):
            state[name] = new if name not in state else torch.cat([state[name], new], dim=2 if name != "keep" else 1)
        t, held = q.shape[2], state["k"].shape[2]
        fill = neg_fill(q.dtype)
        rows = torch.arange(t, device=q.device)[:, None] + held - t
        allowed = (torch.arange(held, device=q.device)[None] <= rows) & state["keep"][:, None, None, :]
        local = (q @ state["k"].transpose(-1, -2)).masked_fill(~allowed, fill)
        if "kt" in state:
            chunk = (q @ state["kt"].transpose(-1, -2) + state["entropy"][:, :, None])
            chunk = chunk.masked_fill(~state["valid"][:, :, None], fill)
            beta = state["beta"]
        else:
            chunk, beta = local[..., :0], v[:, :, :0]
        out = mix(local, state["v"], chunk, beta)
        if held == big:  # the block is complete: summarise its chunks and start a new one
            parts = [rearrange(state[n], "b h (n c) d -> b h n c d", c=c) for n in ("q", "k", "v")]
            kt, beta, entropy, valid = summarise(*parts, rearrange(state["keep"], "b (n c) -> b n c", c=c)[:, None],
                                                 self.config.proposal, scale)
            for name, new in (("kt", kt), ("beta", beta), ("entropy", entropy), ("valid", valid)):
                state[name] = new if name not in state else torch.cat([state[name], new], dim=2)
            for name in ("q", "k", "v", "keep"):
                del state[name]
        return out
