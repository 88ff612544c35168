"""Registry front end: ``build_attention``, argparse integration with prefixes, and listing."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any

from ..errors import HeadwiseError
from ..flags import choices_of, text_type, typed_fields
from .base import MECHANISMS, Mechanism, get_mechanism
from .module import EfficientAttention


def build_core(name: str, num_heads: int, head_dim: int, **args: Any) -> Mechanism:
    """The mechanism core ``name`` (works on projected ``q, k, v [B, H, T, d]``)."""
    return get_mechanism(name)(num_heads, head_dim, **args)


def build_attention(name: str, dim: int, num_heads: int, causal: bool = False, qkv_bias: bool = True,
                    attn_drop: float = 0.0, proj_drop: float = 0.0, **args: Any) -> EfficientAttention:
    """A self-attention ``nn.Module`` over ``[B, T, dim]`` using mechanism ``name`` with its ``args``.

    >>> attn = build_attention("eva", dim=512, num_heads=8, window=128, num_chunks=64)
    >>> y = attn(x, key_padding_mask=pad)      # x [B, T, 512], pad [B, T] bool (True: padding)
    """
    if num_heads < 1 or dim % num_heads:
        raise HeadwiseError(f"dim ({dim}) must be a positive multiple of num_heads ({num_heads})")
    core = build_core(name, num_heads, dim // num_heads, **args)
    return EfficientAttention(core, dim, causal, qkv_bias, attn_drop, proj_drop)


def mechanism_args(name: str) -> list[dict[str, Any]]:
    """``[{name, type, default, help, choices?}]``: the arguments of mechanism ``name``."""
    out = []
    for f in fields(get_mechanism(name).config_class):
        default = f.default if f.default is not MISSING else None
        out.append({"name": f.name, "type": type(default).__name__, "default": default,
                    "help": f.metadata.get("help", ""), **({"choices": list(f.metadata["choices"])}
                                                           if "choices" in f.metadata else {})})
    return out


def list_mechanisms() -> list[dict[str, Any]]:
    """One record per registered mechanism: name, summary, complexity, causal support, arguments."""
    return [{"name": n, "summary": (cls.__doc__ or "").strip().splitlines()[0], "complexity": cls.complexity,
             "causal": cls.can_be_causal, "args": mechanism_args(n)} for n, cls in sorted(MECHANISMS.items())]


class NestedNamespace(argparse.Namespace):
    """An ``argparse`` namespace where ``dest="a.b"`` lands in ``ns.a.b`` (a nested namespace)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if "." in name:
            group, rest = name.split(".", 1)
            inner = getattr(self, group, None)
            if not isinstance(inner, NestedNamespace):
                inner = NestedNamespace()
                super().__setattr__(group, inner)
            setattr(inner, rest, value)
        else:
            super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails
        if "." in name:
            group, rest = name.split(".", 1)
            return getattr(getattr(self, group), rest)
        raise AttributeError(name)


def add_args(parser: argparse.ArgumentParser, name: str, prefix: str = "", struct_name: str = "attn_args"
             ) -> argparse.ArgumentParser:
    """Add mechanism ``name``'s arguments to ``parser`` as ``--{prefix}-{arg}`` (``--window`` with no prefix).

    Parse with ``namespace=NestedNamespace()`` to read them as ``args.<struct_name>.<arg>`` (a dict of them:
    ``vars(args.<struct_name>)``, ready for ``build_attention(name, dim=..., num_heads=..., **that)``).
    """
    group = parser.add_argument_group(f"{name} attention ({prefix or 'no prefix'})")
    lead = f"--{prefix.strip('-')}-" if prefix.strip("-") else "--"
    for f, hint in typed_fields(get_mechanism(name).config_class):  # values as text, by headwise.flags' rules
        default = f.default if f.default is not MISSING else None
        group.add_argument(lead + f.name.replace("_", "-"), dest=f"{struct_name}.{f.name}", type=text_type(hint),
                           default=default, choices=choices_of(hint, f.metadata), metavar=f.name.upper(),
                           help=f"{f.metadata.get('help', '')} (default: {default})")
    return parser
