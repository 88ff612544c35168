"""Where the one-shot 3 → 1 merge of SmolLM2 loses: per layer, the relative key (score) and value (output) error
of each init on the calibration moments (no forward pass; reads the moments cached by kv_conversion.py).

    python experiments/kv_conversion_errors.py [--moments /tmp/headwise-kv-moments.pt] --out experiments/kv_conversion_errors.json
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM

import common
from headwise.conversion.checks import convertible_sites
from headwise.conversion.merge import energy, merge_group
from headwise.conversion.rotary import to_complex
from headwise.conversion.weights import SiteWeights
from headwise.models import resolve_model


def errors(w: SiteWeights, sigma: torch.Tensor, init: str) -> dict:
    """Relative error of the merged scores and of the per-head outputs ``W_o^h v`` on ``sigma``. Scores: summed
    over query heads and rotary pairs, treating the query and key tokens as independent and the relative rotary
    phase as uniform (an estimate: ``E|q̄k − q̄'k'|²`` from second moments)."""
    heads = list(range(w.q.shape[0]))
    fit_sigma = sigma if init == "calibrated" else torch.eye(sigma.shape[0], dtype=torch.float64)
    merged = merge_group(w, heads, init, fit_sigma, True, 1e-4)
    q_old, q_new = to_complex(w.q), to_complex(merged.q)
    k_old = to_complex(w.k[[w.source(h) for h in heads]])
    k_new = to_complex(merged.k)[None]
    s = sigma.to(torch.complex128)
    # E|conj(q) k|² per pair ≈ E|q|² E|k|² for a random relative phase; error of conj(q_new)k_new − conj(q_old)k_old
    quad = lambda a, b: torch.einsum("...fn,nk,...fk->...f", a.conj(), s, b).real  # noqa: E731
    ref = (quad(q_old, q_old) * quad(k_old, k_old)).sum()
    # cross terms: E|q_old* k_old − q_new* k_new|² with q, k at different tokens → products of second moments
    cq = torch.einsum("...fn,nk,...fk->...f", q_old.conj(), s, q_new)
    ck = torch.einsum("...fn,nk,...fk->...f", k_old.conj(), s, k_new.expand_as(k_old))
    err = ref + (quad(q_new, q_new) * quad(k_new.expand_as(k_old), k_new.expand_as(k_old))).sum() \
        - 2 * (cq * ck.conj()).real.sum()
    out_old = w.o @ w.v[[w.source(h) for h in heads]]
    out_new = merged.o @ merged.v[None]
    diff = out_old - out_new
    value = float(energy(diff, sigma).sum() / energy(out_old, sigma).sum())
    return {"key": float(err / ref), "value": value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moments", default="/tmp/headwise-kv-moments.pt")
    parser.add_argument("--out", default=str(common.EXPERIMENTS / "kv_conversion_errors.json"))
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32)
    moments = torch.load(args.moments)
    rows = {}
    for site in convertible_sites(model, "experiment"):
        w = SiteWeights.of(site)
        rows[site.name] = {init: errors(w, moments[site.path], init) for init in ("mean", "svd", "calibrated")}
        print(site.name, json.dumps(rows[site.name]), flush=True)
    common.save_results(args.out, rows)


if __name__ == "__main__":
    main()
