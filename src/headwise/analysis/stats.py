"""``HeadStats``: sum-able accumulators of per-head statistics, their final tables, and the ``stats.json`` file.

Every accumulator is a float64 tensor of sums or counts, so merging two ``HeadStats`` (two shards, two
processes) is addition and ``finalize()`` divides at the very end. Memory is
``O(rows × heads × (bins + heads))`` whatever the amount of data. Tables have one row per (site, layer)
(``rows.Row``) and ``H = max heads`` columns; heads a row does not have read NaN in tensors and are left out
of the JSON lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..io.json_text import json_text
from .metrics import (HIST_BINS, METRIC_INFO, ROW_METRICS, SENTENCE_METRICS, SIMILARITIES, histogram_edges,
                      sparsity_info, sparsity_name)

SCHEMA_VERSION = 1
IMPORTANCES = ("importance_gradient", "importance_ablation")


def _accumulators(rows: int, heads: int, thresholds: int) -> dict[str, torch.Tensor]:
    z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
    acc = {name: z(rows, heads) for name in (*ROW_METRICS, *SENTENCE_METRICS, "confidence_no_special", "entries")}
    acc.update(sparsity=z(rows, thresholds, heads), histogram=z(rows, heads, HIST_BINS),
               similarity=z(rows, len(SIMILARITIES), heads, heads),
               n_rows=z(rows), n_rows_no_special=z(rows), n_sentences=z(rows), sentences=z(()), tokens=z(()))
    return acc


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return None if x != x else x


@dataclass
class HeadStats:
    """Accumulated statistics of the attention heads of one model.

    ``sites``: one ``Row.describe()`` dict per table row; ``thresholds``: the sparsity thresholds;
    ``acc``: the accumulators (name → float64 tensor, see ``_accumulators``); ``examples``: a few full maps
    (JSON-ready, not summed: merging concatenates them). ``normalize_importance``: divide each row of the
    gradient importance by its L2 norm in ``finalize``. ``metric_info``: entries that replace the built-in
    descriptions in ``to_dict`` (``from_dict`` keeps the file's).
    """

    sites: list[dict]
    thresholds: tuple[float, ...]
    acc: dict[str, torch.Tensor]
    model: str = ""
    data: str = ""
    examples: list[dict] = field(default_factory=list)
    normalize_importance: bool = True
    metric_info: dict[str, dict] = field(default_factory=dict)  # overrides of METRIC_INFO (kept from a loaded file)
    seconds: dict[str, float] = field(default_factory=dict)  # this process's wall time per pass (not in to_dict)

    @classmethod
    def empty(cls, sites: list[dict], thresholds: tuple[float, ...], device: torch.device | str = "cpu",
              **meta: Any) -> "HeadStats":
        heads = max(s["num_heads"] for s in sites)
        acc = {k: v.to(device) for k, v in _accumulators(len(sites), heads, len(thresholds)).items()}
        return cls(sites=list(sites), thresholds=tuple(thresholds), acc=acc, **meta)

    @property
    def num_heads(self) -> list[int]:
        return [s["num_heads"] for s in self.sites]

    # ---- accumulation -------------------------------------------------------------------------------------
    def add_(self, row: int, sums: dict[str, torch.Tensor]) -> None:
        """Add the per-layer sums of ``metrics.batch_sums`` into ``row`` (heads fill the first columns)."""
        for name, value in sums.items():
            target = self.acc[name][row]
            target[tuple(slice(0, n) for n in value.shape)] += value.to(target.device, torch.float64)

    def add_importance_(self, kind: str, sums: torch.Tensor, count: float | torch.Tensor) -> None:
        """Add ``sums[rows, H]`` over ``count`` units to ``importance_<kind>`` (created on first use)."""
        name = f"importance_{kind}"
        device = self.acc["tokens"].device
        if name not in self.acc:
            self.acc[name] = torch.zeros_like(self.acc["confidence"])
            self.acc[f"{name}_n"] = torch.zeros((), dtype=torch.float64, device=device)
        self.acc[name][:, : sums.shape[1]] += sums.to(device, torch.float64)
        self.acc[f"{name}_n"] += torch.as_tensor(count, dtype=torch.float64, device=device)

    def merge_(self, other: "HeadStats") -> "HeadStats":
        """Add ``other``'s accumulators into this one (same rows and thresholds); concatenates examples."""
        if [s["path"] for s in other.sites] != [s["path"] for s in self.sites] or other.thresholds != self.thresholds:
            raise ValueError("cannot merge statistics of different models or thresholds")
        for name, value in other.acc.items():
            if name in self.acc:
                self.acc[name] += value.to(self.acc[name].device)
            else:
                self.acc[name] = value.clone()
        self.examples = self.examples + other.examples
        return self

    def all_reduce_(self, group: Any = None) -> "HeadStats":
        """Sum every accumulator over the processes of ``torch.distributed`` (no-op when it is not initialised).

        Every process must hold the same accumulator names (same rows, thresholds and importance kinds).
        """
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            for name in sorted(self.acc):
                dist.all_reduce(self.acc[name], op=dist.ReduceOp.SUM, group=group)
        return self

    # ---- final tables -------------------------------------------------------------------------------------
    @property
    def metric_names(self) -> list[str]:
        names = [*ROW_METRICS[:1], "confidence_no_special", *SENTENCE_METRICS, *ROW_METRICS[1:]]
        names += [sparsity_name(t) for t in self.thresholds]
        return names + [n for n in IMPORTANCES if n in self.acc]

    def finalize(self) -> dict[str, Any]:
        """The final tables (float64, CPU): ``{"heads": {metric: [rows, H]}, "histogram": [rows, H, 100]
        (each head's distribution sums to 1), "similarity": {name: [rows, H, H]}}``; missing heads are NaN."""
        a = {k: v.detach().cpu() for k, v in self.acc.items()}  # divisions below: 0/0 = NaN for a row without data
        per_row, per_sentence = a["n_rows"][:, None], a["n_sentences"][:, None]
        heads = {"confidence": a["confidence"] / per_row,
                 "confidence_no_special": a["confidence_no_special"] / a["n_rows_no_special"][:, None]}
        heads.update({m: a[m] / per_sentence for m in SENTENCE_METRICS})
        heads.update({m: a[m] / per_row for m in ROW_METRICS[1:]})
        for k, t in enumerate(self.thresholds):
            heads[sparsity_name(t)] = a["sparsity"][:, k] / a["entries"]
        if "importance_gradient" in a:
            table = a["importance_gradient"] / a["importance_gradient_n"]
            if self.normalize_importance:
                table = table / (table.norm(dim=1, keepdim=True) + 1e-20)
            heads["importance_gradient"] = table
        if "importance_ablation" in a:
            heads["importance_ablation"] = a["importance_ablation"] / a["importance_ablation_n"]
        hist = a["histogram"] / a["histogram"].sum(-1, keepdim=True)
        sim = {name: a["similarity"][:, k] / per_sentence[..., None] for k, name in enumerate(SIMILARITIES)}
        missing = torch.arange(a["confidence"].shape[1])[None, :] >= torch.tensor(self.num_heads)[:, None]
        for table in heads.values():
            table[missing] = float("nan")
        hist[missing] = float("nan")
        for table in sim.values():
            table[missing] = float("nan")
            table.transpose(1, 2)[missing] = float("nan")
        return {"heads": heads, "histogram": hist, "similarity": sim}

    def __getitem__(self, metric: str) -> torch.Tensor:
        """One final table ``[rows, H]`` by metric name (``stats["entropy"]``)."""
        return self.finalize()["heads"][metric]

    # ---- JSON ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``stats.json`` document (see the package docstring for the schema)."""
        final = self.finalize()
        h = self.num_heads
        per_row = lambda t: [_nan_to_none(t[r, : h[r]].tolist()) for r in range(len(h))]  # noqa: E731
        per_pair = lambda t: [_nan_to_none(t[r, : h[r], : h[r]].tolist()) for r in range(len(h))]  # noqa: E731
        info = {m: METRIC_INFO.get(m) or sparsity_info(float(m.split("@")[1])) for m in final["heads"]}
        if "importance_gradient" in info and not self.normalize_importance:
            info["importance_gradient"] = {**info["importance_gradient"], "range": None,
                                           "description": "Michel et al. head importance E|dL/dg_h| at gates g = 1."}
        info.update({m: dict(v) for m, v in self.metric_info.items() if m in info})
        return {
            "headwise_stats": SCHEMA_VERSION,
            "model": self.model,
            "data": self.data,
            "sentences": int(round(self.acc["sentences"].item())),
            "tokens": int(round(self.acc["tokens"].item())),
            "sites": [dict(s) for s in self.sites],
            "heads": {m: per_row(t) for m, t in final["heads"].items()},
            "metric_info": info,
            "histogram": {"edges": histogram_edges().tolist(), "counts": per_row(final["histogram"])},
            "similarity": {name: per_pair(t) for name, t in final["similarity"].items()},
            "examples": list(self.examples),
        }

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json_text(self.to_dict(), str(path)))
        return path

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "HeadStats":
        """Statistics whose ``finalize()``/``to_dict()`` reproduce ``doc``.

        The file keeps means, not sums: each table is re-weighted by the file's ``tokens`` (per-token
        metrics, histograms) or ``sentences`` (per-sentence metrics, similarity), sparsity and importance by 1, so
        merging loaded statistics averages them with those weights (exact for self-attention rows, which see
        every token, except ``confidence_no_special``). Importance is loaded as final (no re-normalisation).
        """
        if doc.get("headwise_stats") != SCHEMA_VERSION:
            raise ValueError(f"not a headwise stats document (version {doc.get('headwise_stats')!r})")
        names = list(doc["heads"])
        thresholds = tuple(float(n.split("@", 1)[1]) for n in names if n.startswith("sparsity@"))
        stats = cls.empty(doc["sites"], thresholds, model=doc.get("model", ""), data=doc.get("data", ""),
                          examples=list(doc.get("examples", [])), normalize_importance=False,
                          metric_info=dict(doc.get("metric_info", {})))
        acc, tokens, sentences = stats.acc, float(doc["tokens"]), float(doc["sentences"])
        acc["tokens"] += tokens
        acc["sentences"] += sentences

        def table(values: list, shape_tail: tuple[int, ...] = ()) -> torch.Tensor:
            out = torch.full((len(values), acc["confidence"].shape[1], *shape_tail), float("nan"), dtype=torch.float64)
            for r, row in enumerate(values):
                out[r, : len(row)] = torch.tensor(_none_to_nan(row), dtype=torch.float64)
            return out

        for key in ("n_rows", "n_rows_no_special"):
            acc[key] += tokens
        acc["n_sentences"] += sentences
        for name, values in doc["heads"].items():
            t = table(values).nan_to_num(0.0)
            if name.startswith("sparsity@"):
                acc["sparsity"][:, thresholds.index(float(name.split("@", 1)[1]))] = t
            elif name in IMPORTANCES:
                stats.add_importance_(name.removeprefix("importance_"), t, 1.0)
            else:
                acc[name] += t * (sentences if name in SENTENCE_METRICS else tokens)
        acc["entries"] += 1.0
        acc["histogram"] += table(doc["histogram"]["counts"], (HIST_BINS,)).nan_to_num(0.0) * tokens
        for k, name in enumerate(SIMILARITIES):
            sim = torch.full_like(acc["similarity"][:, 0], float("nan"))
            for r, rows in enumerate(doc["similarity"][name]):
                sim[r, : len(rows), : len(rows)] = torch.tensor(_none_to_nan(rows), dtype=torch.float64)
            acc["similarity"][:, k] = sim.nan_to_num(0.0) * sentences
        return stats


def _none_to_nan(x: Any) -> Any:
    if isinstance(x, list):
        return [_none_to_nan(v) for v in x]
    return float("nan") if x is None else x
