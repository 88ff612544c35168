"""Attention-probability pruning and quantization (SPIQA, Ji et al. 2021), with the accuracy trade-off measured.

>>> quantize_attention(model, quantizer="linear_slog_clamped_midval", bits=3)    # attach to every site
>>> with measuring(model) as m: model(**batch)
>>> m.sparsity, m.distinct                                                    # share of zeros, values used
>>> result = sweep(model, metric=get_task("stsb").metric_fn(tokenizer), methods=["linear_slog"], bits=range(1, 9))

Methods (``QUANTIZERS``; pure functions in :mod:`.functional`): ``linear_slinear``, ``linear_slinear_midval``,
``linear_slinear_clamped``, ``linear_slinear_clamped_midval``, ``linear_slog``, ``linear_slog_midval``,
``linear_slog_clamped_midval``, ``uniform_slinear_clamped_mean``, ``uniform_slog_clamped_mean``,
``uniform_slog_mean``, ``binarization``; ``"none"`` prunes only. Options: :class:`QuantizationConfig`.

The names load on first use (``headwise.lazy``): ``.config`` and ``.declaration`` import without torch.
"""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from . import functional
    from .attach import NAME, Measurement, measuring, quantize_attention, quantizers_of, remove_quantization
    from .config import ALIASES, METHOD_NAMES, QuantizationConfig
    from .functional import QUANTIZERS, prune
    from .layer import AttentionQuantizer, population, transform
    from .method import Quantization  # registers the package's method
    from .sweep import SweepConfig, SweepResult, sweep

_names, __dir__ = _lazy(__name__, globals())


def __getattr__(name: str):
    if name == "METHODS":  # its name before 0.2: one release of warning, then gone
        import warnings

        warnings.warn("headwise.quantization.METHODS is now QUANTIZERS", FutureWarning, stacklevel=2)
        return _names("QUANTIZERS")
    return _names(name)
