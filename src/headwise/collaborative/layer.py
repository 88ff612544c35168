"""The collaborative attention layer: heads share one query and one key projection of width ``D~k``.

Head ``h`` scores ``s·(x_iᵀ W~q diag(m_h) W~kᵀ x_j + c_hᵀ x_j)`` with ``s`` the original ``1/√d``; values and
output projection are per head, as before. ``c_h`` is the *content bias*: the only part of the original query /
key biases that survives the softmax (``b_qᵀ W_k^h x_j``; terms constant in ``j`` cancel).

Both terms go through one dot product, so any attention function (SDPA, the explicit headwise path with
probability ops, ``output_attentions``) runs unchanged: with ``R = D~k`` the per-head query is
``[q̃ ⊙ m_h, e_h]`` (width ``R + H``, ``e_h`` one-hot) and the key, shared by all heads, is ``[k̃, C x]``.
The key is passed as one head expanded to ``H`` (a view, never copied per head; a cache stores it once), and
only the side with fewer positions — the query, ``T_q ≤ T_k`` in self-attention and decoding — is mixed.

Cost per layer, ``T`` tokens, hidden ``D``, ``H`` heads of width ``d`` (multiply-adds, scores part only):

| | parameters (q, k) | projections | scores |
|---|---|---|---|
| concatenated heads | ``2·D·H·d + 2·H·d`` | ``2·T·D·H·d`` | ``H·T²·d`` |
| collaborative | ``2·D·R + H·R + H·D`` | ``2·T·D·R + T·D·H + H·T·R`` | ``H·T²·(R + H)`` |
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from ..errors import HeadwiseError
from ..runtime.attention import headwise_attention


class CollaborativeAttention(nn.Module):
    """Collaborative multi-head self-attention, ready to train from scratch.

    ``CollaborativeAttention(hidden_size=384, num_heads=12, dk=128)``; ``forward(x[B, T, D], attention_mask=None
    ([B, T] bool/0-1 "real token", or a [B, 1|H, Tq, Tk] bool / additive mask), output_attentions=False)`` →
    ``(out[B, T, D], probs[B, H, T, T] | None)``. ``mixing`` starts as concatenated heads of width ``dk / H``
    (dimension ``c`` belongs to head ``c mod H``), so the layer begins as standard multi-head attention.

    Converted pretrained modules (``headwise.collaborative.compress``) are instances of this class *and* of
    their family's attention class: they keep the family's ``forward`` signature and sub-module names and
    share the scoring code below (``collaborative_qk``, ``attend``).
    """

    shares_query_key = True  # read by sites (AttentionSite.shares_query_key): no per-head query/key edits

    def __init__(self, hidden_size: int, num_heads: int, dk: int, head_dim: int | None = None,
                 dropout: float = 0.0, causal: bool = False, bias: bool = True) -> None:
        super().__init__()
        head_dim = head_dim or hidden_size // num_heads
        self.num_heads, self.head_dim, self.dk = num_heads, head_dim, dk
        self.scaling = head_dim**-0.5
        self.is_causal, self.dropout = causal, dropout
        self.query = nn.Linear(hidden_size, dk, bias=False)
        self.key = nn.Linear(hidden_size, dk, bias=False)
        dims, heads = (torch.arange(n, device=self.query.weight.device) for n in (dk, num_heads))
        self.mixing = nn.Parameter((dims[None] % num_heads == heads[:, None]).float())
        self.content_bias = nn.Linear(hidden_size, num_heads, bias=False)
        nn.init.zeros_(self.content_bias.weight)
        self.value = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.output = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)

    def collaborative_qk(self, q: torch.Tensor, k: torch.Tensor, keys_from: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q̃[B, Tq, R]``, ``k̃[B, Tk, R]``, key-side hidden states ``[B, Tk, D]`` → per-head query
        ``[B, H, Tq, R + H]`` and the shared key ``[B, 1, Tk, R + H]``."""
        return self.collaborative_query(q), self.collaborative_key(k, keys_from)

    def collaborative_query(self, q: torch.Tensor) -> torch.Tensor:
        """``q̃[B, Tq, R]`` → per-head query ``[q̃ ⊙ m_h, e_h]`` ``[B, H, Tq, R + H]``."""
        mixing = self.mixing.to(q.dtype)
        heads = mixing.shape[0]
        mixed = rearrange(q, "b t r -> b 1 t r") * rearrange(mixing, "h r -> 1 h 1 r")
        tag = torch.eye(heads, dtype=q.dtype, device=q.device)[None, :, None, :].expand(q.shape[0], -1, q.shape[1], -1)
        return torch.cat([mixed, tag], dim=-1)

    def collaborative_key(self, k: torch.Tensor, keys_from: torch.Tensor) -> torch.Tensor:
        """``k̃[B, Tk, R]`` and the key-side hidden states ``[B, Tk, D]`` (the encoder's, in cross-attention) →
        the shared key ``[k̃, C x]`` ``[B, 1, Tk, R + H]``."""
        return rearrange(torch.cat([k, self.content_bias(keys_from)], dim=-1), "b t r -> b 1 t r")

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, dropout: float,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The headwise attention function on ``query[B, H, Tq, R+H]``, ``key[B, 1, Tk, R+H]``,
        ``value[B, H, Tk, d]`` (ops attached to this module apply) → ``(out[B, Tq, H·d], probs | None)``."""
        key = key.expand(-1, value.shape[1], -1, -1)
        out, probs = headwise_attention(self, query, key, value, attention_mask, scaling=self.scaling,
                                        dropout=dropout, **kwargs)
        return out.flatten(2), probs

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = attention_mask.bool()[:, None, None, :]
            if self.is_causal:
                t = hidden_states.shape[1]
                attention_mask = attention_mask & torch.ones(t, t, dtype=torch.bool, device=hidden_states.device).tril()
        query, key = self.collaborative_qk(self.query(hidden_states), self.key(hidden_states), hidden_states)
        value = rearrange(self.value(hidden_states), "b t (h d) -> b h t d", h=self.num_heads)
        out, probs = self.attend(query, key, value, attention_mask, self.dropout if self.training else 0.0,
                                 is_causal=self.is_causal, output_attentions=output_attentions)
        return self.output(out), probs

    def _get_name(self) -> str:
        family = getattr(type(self), "family_class", None)
        return f"Collaborative{family.__name__}" if family is not None else "CollaborativeAttention"

    def extra_repr(self) -> str:
        return f"dk={self.mixing.shape[1]}, heads={self.mixing.shape[0]}"


class RotaryCollaborativeAttention(CollaborativeAttention):
    """Collaborative scoring under rotary positions (converted Llama / Mistral modules; see
    ``headwise.collaborative.rotary``). The ``R/2`` shared planes (rows ``r`` and ``r + R/2`` of ``W~q``, ``W~k``,
    the ``rotate_half`` layout) turn at the rotary frequency ``frequencies[r]`` (a buffer, ``[R/2]`` indices into
    the head's ``d/2`` frequencies); head ``h`` scales plane ``r`` of the rotated shared query by the complex
    number ``mixing[h, r] + i·mixing[h, r + R/2]``, which commutes with the rotation. No content bias: a query
    bias under rotation is position-dependent, so biased rotary models are refused."""

    def rotary_qk(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shared ``q̃[B, Tq, R]``, ``k̃[B, Tk, R]`` and the model's rotary ``cos, sin: [B, T, d]`` → per-head
        query ``[B, H, Tq, R]`` and the shared key ``[B, 1, Tk, R]``, both rotated."""
        if cos.shape[-1] != self.head_dim:
            raise HeadwiseError(f"{type(self).__name__}: rotary tables of width {cos.shape[-1]} for heads of "
                                f"width {self.head_dim}; partial rotary embeddings are not supported")
        half = self.frequencies
        cos = torch.cat([cos[..., half]] * 2, dim=-1).to(q.dtype)
        sin = torch.cat([sin[..., half]] * 2, dim=-1).to(q.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        qa, qb = rearrange(q, "b t (two r) -> two b 1 t r", two=2)
        n_re, n_im = rearrange(self.mixing.to(q.dtype), "h (two r) -> two 1 h 1 r", two=2)
        query = torch.cat([qa * n_re - qb * n_im, qb * n_re + qa * n_im], dim=-1)
        return query, rearrange(k, "b t r -> b 1 t r")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rotary"


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the ``rotate_half`` layout: planes ``(r, r + R/2)`` turned by ``cos``, ``sin``."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin
