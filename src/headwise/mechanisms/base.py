"""The mechanism core: already-projected ``q, k, v [B, H, T, d]`` + key padding mask + causal flag -> ``[B, H, T, d]``.

Every mechanism subclasses ``Mechanism``, declares a config dataclass (its arguments, with help text and checks)
and registers itself with ``@register``. The same core runs inside the standalone module (``build_attention``) and
inside a transformers model (``headwise.mechanisms.use``).

Conventions: ``key_padding_mask`` is ``[B, T]`` bool with True at padded positions (as ``nn.MultiheadAttention``);
padded keys get zero weight and padded queries produce unspecified (finite) rows. ``scale`` multiplies ``q·k``
(default ``d ** -0.5``). Causal means query ``i`` sees keys ``j <= i``.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import HeadwiseError

State = dict[str, Any]
AUTOCAST_DEVICES = ("cuda", "cpu", "xpu", "mps")


@dataclass
class MechanismConfig:
    """Base of the per-mechanism configs. Field metadata: ``help`` (argparse help text)."""

    def check(self) -> None:
        """Raise ``HeadwiseError`` on a bad value (subclasses extend)."""


def positive(name: str, value: int | float | None, minimum: int | float = 1) -> None:
    if value is not None and value < minimum:
        raise HeadwiseError(f"{name} must be >= {minimum}, got {value}")


class Mechanism(nn.Module):
    """Base of every mechanism core.

    Subclasses set ``name``, ``config_class``, ``complexity`` (a short string), ``can_be_causal`` and implement
    ``attend(q, k, v, keep, causal, scale)`` where ``keep`` is ``[B, T]`` bool (True: real token) or None.
    Causal mechanisms may override ``decode`` with a constant-size state; the default keeps the history and
    recomputes (exact, O(T) per step).
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[MechanismConfig]] = MechanismConfig
    complexity: ClassVar[str] = ""
    can_be_causal: ClassVar[bool] = True
    #: dtype of feature maps, normalisers and running sums for half-precision inputs (``None``: the input dtype,
    #: for cores that only call SDPA, which accumulates in float32 itself). Outputs always have the input dtype.
    compute_dtype: ClassVar[torch.dtype | None] = torch.float32

    def __init__(self, num_heads: int, head_dim: int, **args: Any) -> None:
        super().__init__()
        positive("num_heads", num_heads)
        positive("head_dim", head_dim)
        known = {f.name for f in fields(self.config_class)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise HeadwiseError(
                f"mechanism {self.name!r} has no argument(s) {', '.join(unknown)}; "
                f"its arguments are: {', '.join(sorted(known)) or '(none)'}"
            )
        self.num_heads, self.head_dim = num_heads, head_dim
        self.config = self.config_class(**args)
        self.config.check()

    def spec(self) -> dict[str, Any]:
        """JSON constructor arguments (rebuilds an identical core)."""
        return {"num_heads": self.num_heads, "head_dim": self.head_dim, **asdict(self.config)}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.spec().items())

    def uses_past_queries(self) -> bool:
        """True when causal outputs depend on earlier queries (not only keys and values): a model's cached
        generation, which keeps keys and values only, cannot run such a core."""
        return False

    def check_causal(self, causal: bool) -> None:
        if causal and not self.can_be_causal:
            causal_ones = ", ".join(sorted(n for n, c in MECHANISMS.items() if c.can_be_causal))
            raise HeadwiseError(
                f"mechanism {self.name!r} cannot be causal (each query mixes information from every key); "
                f"causal mechanisms: {causal_ones}"
            )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                causal: bool = False, scale: float | None = None) -> torch.Tensor:
        """``q, k, v [B, H, T, d]``, ``key_padding_mask [B, T]`` (True: padded) -> ``[B, H, T, d]``."""
        self.check_causal(causal)
        if q.shape[-2] != k.shape[-2]:
            raise HeadwiseError(f"mechanism {self.name!r} is self-attention: got {q.shape[-2]} queries, "
                                f"{k.shape[-2]} keys")
        keep = None if key_padding_mask is None else ~key_padding_mask.to(torch.bool)
        return self.run(q, k, v, keep, causal, q.shape[-1] ** -0.5 if scale is None else scale)

    def _upcast(self, *xs: torch.Tensor) -> list[torch.Tensor]:
        if self.compute_dtype is None or not xs[0].is_floating_point():
            return list(xs)
        dtype = torch.promote_types(xs[0].dtype, self.compute_dtype)  # float64 stays float64 (gradcheck)
        return [x.to(dtype) for x in xs]

    def _precise(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Autocast off while a core computes in ``compute_dtype`` (it would cast the matmuls back to half)."""
        if self.compute_dtype is None or device.type not in AUTOCAST_DEVICES:
            return contextlib.nullcontext()
        return torch.autocast(device.type, enabled=False)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, causal: bool,
            scale: float) -> torch.Tensor:
        """``attend`` in ``compute_dtype``, returned in the input dtype (what ``forward`` and the drop-in call)."""
        with self._precise(q.device):
            return self.attend(*self._upcast(q, k, v), keep, causal, scale).to(q.dtype)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, state: State,
             scale: float) -> torch.Tensor:
        """``decode`` in ``compute_dtype`` (the state keeps that dtype), returned in the input dtype."""
        with self._precise(q.device):
            return self.decode(*self._upcast(q, k, v), keep, state, scale).to(q.dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, causal: bool,
               scale: float) -> torch.Tensor:
        raise NotImplementedError

    # ---- incremental decoding -------------------------------------------------------------------------------
    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, state: State,
               scale: float) -> torch.Tensor:
        """Causal outputs of ``t`` new tokens (``[B, H, t, d]``) given everything seen before; updates ``state``.

        Default: keep the history and rerun the causal forward (exact, O(T) work per step).
        """
        keep = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=q.device) if keep is None else keep
        for key, new in (("q", q), ("k", k), ("v", v)):
            state[key] = new if key not in state else torch.cat([state[key], new], dim=2)
        state["keep"] = keep if "keep" not in state else torch.cat([state["keep"], keep], dim=1)
        out = self.attend(state["q"], state["k"], state["v"], state["keep"], True, scale)
        return out[:, :, -q.shape[2]:]


MECHANISMS: dict[str, type[Mechanism]] = {}


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Class decorator: make ``cls`` available to ``build_attention`` under ``cls.name``."""
    MECHANISMS[cls.name] = cls
    return cls


def get_mechanism(name: str) -> type[Mechanism]:
    if name not in MECHANISMS:
        raise HeadwiseError(f"unknown attention mechanism {name!r}; available: {', '.join(sorted(MECHANISMS))}")
    return MECHANISMS[name]


# ---- helpers shared by the cores ----------------------------------------------------------------------------
def pad_to(x: torch.Tensor, multiple: int, dim: int) -> torch.Tensor:
    """Zero-pad ``x`` along ``dim`` to a multiple of ``multiple``."""
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def keep_or_ones(keep: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """``keep [B, T]`` or all True."""
    return torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=q.device) if keep is None else keep


def neg_fill(dtype: torch.dtype) -> float:
    """A large negative logit that stays finite in softmax (fully masked rows become uniform, not NaN)."""
    return torch.finfo(dtype).min / 2


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
