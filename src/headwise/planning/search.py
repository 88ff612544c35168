"""Combined plans from measured single methods: every pair (heads removed: a level of a sweep of role ``"heads"``)
× (a level of a method of role ``"pair"``) is predicted — score drops add, cost ratios multiply — and the best predicted pairs inside the budget become
finalists that are then measured."""

from __future__ import annotations

from typing import Any, Sequence

from .axes import COST_KEYS
from .budget import Budget
from .candidates import Candidate
from .edits import Edit


def combine(first: Edit, second: Edit) -> Edit:
    """``first`` (heads removed) with ``second``'s method."""
    return first.then(second)


def predict(base: dict[str, Any], a: dict[str, Any], b: dict[str, Any], sign: float) -> dict[str, Any]:
    """Predicted measurement of a combination of two measured single edits ``a`` (heads) and ``b``: the score
    changes add (``sign`` = +1 when higher is better), cost ratios to ``base`` multiply, heads come from ``a``."""
    out = {"score": base["score"] + (a["score"] - base["score"]) + (b["score"] - base["score"]),
           "heads": a["heads"]}
    for axis in COST_KEYS:
        if base.get(axis) and a.get(axis) is not None and b.get(axis) is not None:
            out[axis] = a[axis] * b[axis] / base[axis]
        else:
            out[axis] = None
    out["goodness"] = sign * out["score"]
    return out


def finalists(prunes: Sequence[tuple[Candidate, dict]], others: Sequence[tuple[Candidate, dict]],
              base: dict[str, Any], budget: Budget, sign: float, top_k: int
              ) -> list[tuple[str, list[str], Edit, dict[str, Any]]]:
    """What to measure among the pairs: the ``top_k`` of best predicted score whose predicted
    costs meet ``budget`` (if none does, the ``top_k`` least over budget), then, for each level of heads removed,
    its best predicted pair and its cheapest one (least predicted share of the budget), so the combined curve spans
    the front and a pair whose second method costs less on the pruned model than alone (a collaborative width is
    a share of the heads left) is measured, not ruled out by its prediction. Returns
    ``(name, parts, edit, prediction)``."""
    pairs = []
    for p, pm in prunes:
        for o, om in others:
            edit = combine(p.edit, o.edit)
            pred = predict(base, pm, om, sign)
            over = budget.violations(pred, base)
            pairs.append((len(over), -pred["goodness"], f"{p.name}+{o.name}", [p.name, o.name], edit, pred,
                          budget.load(pred, base)))
    fitting = [x for x in pairs if x[0] == 0] or pairs
    chosen = sorted(fitting, key=lambda x: (x[0], x[1]))[:top_k]
    for p, _ in prunes:
        level = [x for x in pairs if x[3][0] == p.name]
        if level:
            chosen.append(min(level, key=lambda x: x[1]))
            chosen.append(min(level, key=lambda x: (x[6], x[1])))
    seen, out = set(), []
    for _, _, name, parts, edit, pred, _ in chosen:
        if name not in seen:
            seen.add(name)
            out.append((name, parts, edit, pred))
    return out
