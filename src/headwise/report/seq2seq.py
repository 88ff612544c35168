"""The encoder-decoder analysis report (``headwise analyze --task translation``): confidence and gradient importance
heatmaps per attention kind, roles per head, and how well confidence ranks heads like importance does."""

from __future__ import annotations

from . import svg
from .builder import Report


def seq2seq_report(stats: dict) -> Report:
    """``stats``: ``headwise.analysis.Seq2SeqStats.to_dict()`` (plus optional ``model`` and ``data`` strings)."""
    report = Report("headwise encoder-decoder head analysis", stats.get("model") or None,
                    meta={"data": stats.get("data", ""), "alignment": stats["alignment_source"],
                          "rare-token frequencies": stats["frequency_source"]})
    kinds = list(dict.fromkeys(site["kind"] for site in stats["sites"]))
    for kind in kinds:
        rows = [r for r, site in enumerate(stats["sites"]) if site["kind"] == kind]
        labels = [stats["sites"][r]["name"] for r in rows]
        section = report.add_section(f"{kind} heads", "Confidence: mean largest attention weight of a query row "
                                     "(Voita et al.). Importance: Michel et al.'s E|∂L/∂g_h| of the label loss, "
                                     "each layer normalised to unit L2 norm.")
        figures = [(svg.heatmap([stats["scores"]["confidence"][r] for r in rows], labels,
                                [str(h) for h in range(len(stats["scores"]["confidence"][rows[0]]))],
                                f"confidence, {kind}", vmin=0.0, vmax=1.0, xlabel="head", ylabel="layer"), None)]
        if stats.get("importance_gradient") is not None:
            figures.append((svg.heatmap([stats["importance_gradient"][r] for r in rows], labels,
                                        [str(h) for h in range(len(stats["importance_gradient"][rows[0]]))],
                                        f"gradient importance, {kind}", xlabel="head", ylabel="layer"), None))
        section.grid(figures)
        spearman = stats.get("confidence_vs_importance_spearman", {}).get(kind)
        heads = [h for h in stats["heads"] if h["kind"] == kind]
        section.table([[f"{kind}.{h['layer']}", h["head"], h["confidence"], h["importance"], h["prev"], h["next"],
                        h["rare"], h["alignment"], ", ".join(h["roles"]) or "—"] for h in heads],
                      ["layer", "head", "confidence", "importance", "prev", "next", "rare", "alignment", "roles"],
                      caption="Role scores are shares of query rows" + (
                          f"; Spearman(confidence, importance) over these heads = {spearman:.3f}"
                          if spearman is not None else ""))
    return report
