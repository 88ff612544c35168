"""The accuracy trade-off: a grid of pruning / quantization settings, each scored against the unmodified model.

``sweep(model, metric=fn)`` scores ``fn(model) -> float`` (higher is better; a task's ``metric_fn`` gives one for
STS-B, perplexity, BLEU or accuracy). Every setting also reports the measured sparsity (share of attention
values that are exactly 0) and the number of distinct values used.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from torch import nn

from ..contract import with_keywords
from ..errors import HeadwiseError
from ..progress import progress_bar
from ..runtime import eval_mode, using_headwise
from ..sites import find_sites
from .attach import measuring, quantize_attention, remove_quantization
from .config import METHOD_NAMES, NONE, QuantizationConfig
from .functional import QUANTIZERS

Metric = Callable[[nn.Module], float]
DEFAULT_BITS: tuple[int, ...] = tuple(range(1, 9))
DEFAULT_THRESHOLDS: tuple[float, ...] = (1e-4, 1e-3, 3e-3, 1e-2, 2e-2, 3e-2, 5e-2, 0.1, 0.2)
BITLESS = (NONE, "binarization")
PRUNING = "threshold pruning"  # the summary's name for the pruning-only settings
SWEEP_OP = "spiqa_sweep"


@dataclass
class SweepConfig:
    """The grid of ``sweep``.

    - ``methods``: quantizers, each tried with every value of ``bits`` (``binarization`` once).
    - ``thresholds``: pruning-only settings (method ``"none"``), one per threshold: the metric-vs-pruned curve.
    - ``base``: every other option of the settings (``QuantizationConfig``); ``base.threshold`` is the pruning
      applied before every quantizer (0: none, as in the seed's quantizer runs).
    - ``tolerance``: "within" means ``metric ≥ baseline − tolerance·|baseline|`` (1% relative by default).
    - ``distinct_calls``: calls per site whose distinct output values are counted (``torch.unique`` is slow).
    """

    methods: tuple[str, ...] = tuple(QUANTIZERS)
    bits: tuple[int, ...] = DEFAULT_BITS
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    base: QuantizationConfig = field(default_factory=QuantizationConfig)
    tolerance: float = 0.01
    distinct_calls: int = 2

    def __post_init__(self) -> None:
        self.methods, self.bits = tuple(self.methods), tuple(self.bits)
        self.thresholds = tuple(float(t) for t in self.thresholds)
        if not 0 < self.tolerance < 1:
            raise HeadwiseError(f"tolerance must lie in (0, 1) (0.01 = 1% relative), got {self.tolerance}")
        if self.methods and not self.bits:
            raise HeadwiseError("give at least one bit width")
        if not self.methods and not self.thresholds:
            raise HeadwiseError("nothing to sweep: give methods or thresholds")
        self.settings()  # every setting validates itself

    def settings(self) -> list[QuantizationConfig]:
        """Pruning-only settings first, then methods × bits."""
        out = [replace(self.base, quantizer=NONE, threshold=t, scope="tensor") for t in self.thresholds]
        for method in self.methods:
            if method not in METHOD_NAMES:  # before replace(), for the error listing the names
                QuantizationConfig(quantizer=method)
            scope = "tensor" if self.base.scope == "row" and method != "binarization" else self.base.scope
            for bits in (self.bits[:1] if method in BITLESS else self.bits):
                out.append(replace(self.base, quantizer=method, bits=bits, scope=scope))
        return out


@dataclass
class SweepResult:
    """Baseline and one row per setting: ``label, method, bits (None: not used), threshold, metric, drop
    (relative to the baseline; None when the baseline is 0), within, sparsity, distinct, distinct_union, seconds,
    per_head`` (``per_head``: share of zeros per head, one list per site in ``sites`` order)."""

    baseline: float
    tolerance: float
    rows: list[dict[str, Any]]
    sites: list[str]
    base: dict[str, Any]
    model: str = ""
    metric_name: str = ""
    baseline_seconds: float = 0.0

    def summary(self) -> list[dict[str, Any]]:
        """Per method (and ``"threshold pruning"``): the fewest bits within tolerance and the largest measured
        sparsity within tolerance, with the settings they come from (None where no setting is within)."""
        out = []
        names = list(dict.fromkeys(r["method"] for r in self.rows))
        for name in names:
            rows = [r for r in self.rows if r["method"] == name]
            ok = [r for r in rows if r["within"]]
            fewest = min((r for r in ok if r["bits"] is not None), key=lambda r: r["bits"], default=None)
            sparsest = max(ok, key=lambda r: r["sparsity"], default=None)
            out.append({
                "method": PRUNING if name == NONE else name,
                "fewest_bits": None if fewest is None else fewest["bits"],
                "metric_at_fewest_bits": None if fewest is None else fewest["metric"],
                "max_sparsity": None if sparsest is None else sparsest["sparsity"],
                "max_sparsity_setting": None if sparsest is None else sparsest["label"],
                "metric_at_max_sparsity": None if sparsest is None else sparsest["metric"],
                "settings": len(rows), "within": len(ok),
            })
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"headwise_quantization": 1, **asdict(self), "summary": self.summary()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepResult":
        if data.get("headwise_quantization") != 1:
            raise HeadwiseError("not a headwise quantization result (results.json written by `headwise quantize`)")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def sweep(model: nn.Module, config: SweepConfig | None = None, *, metric: Metric | None = None,
          progress: bool | None = None, **options: Any) -> SweepResult:
    """Score ``model`` unchanged (the baseline), then with each setting of ``config`` attached in turn.

    ``metric(model) -> float``, higher is better (a task's ``metric_fn``, e.g.
    ``headwise.tasks.get_task("stsb").metric_fn(tokenizer)`` for STS-B dev Spearman ×100).
    ``options``: ``SweepConfig`` fields (one that conflicts with ``config`` raises). The model runs in eval mode
    with the ``headwise`` implementation; the sweep's quantizers are detached afterwards, also on error.
    """
    cfg = with_keywords(SweepConfig, config, **options)
    if metric is None:
        raise HeadwiseError("sweep needs metric=fn(model) -> float (higher is better), e.g. "
                            "headwise.tasks.get_task('stsb').metric_fn(tokenizer)")
    settings = cfg.settings()
    sites = [s.path for s in find_sites(model)]
    rows: list[dict[str, Any]] = []
    with using_headwise(model), eval_mode(model):
        start = time.perf_counter()
        baseline = float(metric(model))
        baseline_seconds = time.perf_counter() - start
        floor = baseline - cfg.tolerance * abs(baseline)
        try:
            for setting in progress_bar(settings, desc="quantization sweep", unit="setting",
                                        disable=None if progress is None else not progress):
                quantize_attention(model, setting, name=SWEEP_OP)
                start = time.perf_counter()
                with measuring(model, SWEEP_OP, cfg.distinct_calls) as measured:
                    value = float(metric(model))
                heads = measured.per_head
                rows.append({
                    "label": setting.label, "method": setting.quantizer,
                    "bits": None if setting.quantizer in BITLESS else setting.bits, "threshold": setting.threshold,
                    "metric": value, "drop": (baseline - value) / abs(baseline) if baseline else None,
                    "within": value >= floor, "sparsity": measured.sparsity, "distinct": measured.distinct,
                    "distinct_union": measured.distinct_union, "seconds": time.perf_counter() - start,
                    "per_head": [heads.get(path) for path in sites],
                })
        finally:
            remove_quantization(model, SWEEP_OP)
    name = str(getattr(model.config, "_name_or_path", "") or model.config.model_type)
    return SweepResult(baseline, cfg.tolerance, rows, sites, cfg.base.to_dict(), name,
                       getattr(metric, "__name__", "metric"), baseline_seconds)
