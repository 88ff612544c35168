"""Print the Markdown tables of docs/tasks.md ("Seeds on the Multi30k model") from the results JSONs of
mt_story_of_heads.py, mt_mhr.py, mt_spiqa.py and mt_collaborative.py (missing files are skipped).

    python experiments/mt_tables.py
"""

from __future__ import annotations

import common

KINDS = ("enc-self", "dec-self", "dec-enc")


def load(name: str) -> dict | None:
    return common.load_results(common.RESULTS / name) or None


def story(r: dict) -> None:
    base, control = r["baseline"]["bleu"], r.get("control", {}).get("bleu")
    print("| arm | heads kept (enc-self / dec-self / dec-enc) | open gates after L0 | BLEU | Δ vs control |")
    print("|---|---|---|---:|---:|")
    print(f"| baseline | 24 / 24 / 24 | — | {base:.2f} | — |")
    if control is not None:
        print(f"| control ({r['setup']['train'].split(', ')[-2]}) | 24 / 24 / 24 | — | {control:.2f} | 0 |")
    for name in sorted((k for k in r if k.startswith("l0-")), key=lambda k: -int(k[3:])):
        a = r[name]
        kept = " / ".join(str(a["kept"][k]) for k in KINDS)
        opened = " / ".join(str(a["open_after_l0"][k]) for k in KINDS)
        delta = "" if control is None else f"{a['bleu'] - control:+.2f}"
        print(f"| L0, keep {a['target']} | {kept} | {opened} | {a['bleu']:.2f} | {delta} |")
    for name in sorted((k for k in r if k.startswith("l0-")), key=lambda k: -int(k[3:])):
        print(f"\n{name} open gates per kind during training:", ", ".join(
            f"step {t['step']}: " + "/".join(str(t[k]) for k in KINDS) for t in r[name]["trace"]))
        print(f"{name} survivors:", "; ".join(f"{k} " + ", ".join(f"L{layer}: {heads}" for layer, heads in
                                                                   r[name]["survivors"][k].items()) for k in KINDS))


def analysis(a: dict, story_results: dict) -> None:
    heads = a["heads"]
    print("\n| kind | mean confidence | max confidence | roles (heads) | Spearman(confidence, gradient importance) |")
    print("|---|---:|---:|---|---:|")
    for kind in KINDS:
        hs = [h for h in heads if h["kind"] == kind]
        conf = [h["confidence"] for h in hs]
        roles = {}
        for h in hs:
            for role in h["roles"]:
                roles[role] = roles.get(role, 0) + 1
        rho = a["confidence_vs_importance_spearman"][kind]
        print(f"| {kind} | {sum(conf) / len(conf):.3f} | {max(conf):.3f} | "
              f"{', '.join(f'{k} {v}' for k, v in roles.items()) or 'none'} | {rho:.2f} |")
    for name in sorted((k for k in story_results if k.startswith("l0-")), key=lambda k: -int(k[3:])):
        survivors = story_results[name]["survivors"]
        kept = [h for h in heads if h["head"] in survivors[h["kind"]][str(h["layer"])]]
        for kind in KINDS:
            ks = [h for h in kept if h["kind"] == kind]
            gone = [h for h in heads if h["kind"] == kind and h not in ks]
            mean = lambda xs, key: sum(x[key] for x in xs) / len(xs) if xs else float("nan")  # noqa: E731
            print(f"{name} {kind}: kept {len(ks)} (roles: {sum(bool(h['roles']) for h in ks)}), mean confidence "
                  f"kept {mean(ks, 'confidence'):.3f} vs removed {mean(gone, 'confidence'):.3f}, mean importance "
                  f"kept {mean(ks, 'importance'):.3f} vs removed {mean(gone, 'importance'):.3f}")
    print("largest role scores:", {k: {s: round(max((h[s] or 0) for h in heads if h["kind"] == k), 3)
                                       for s in ("prev", "next", "rare", "alignment")} for k in KINDS})


def mhr(r: dict, control: float | None) -> None:
    print("\n| arm | BLEU before | after swaps | after fine-tuning | Δ vs control |")
    print("|---|---:|---:|---:|---:|")
    for name, a in r["arms"].items():
        tuned = a["finetune_epochs"] > 0
        delta = f"{a['metric_after'] - control:+.2f}" if tuned and control is not None else "—"
        print(f"| {name} | {a['metric_before']:.2f} | {a['metric_after_swaps']:.2f} | "
              f"{a['metric_after']:.2f}{'' if tuned else ' (no training)'} | {delta} |")
        if a.get("nuclear_norms"):
            norms = list(a["nuclear_norms"].values())
            print(f"|  | nuclear norms {min(norms):.2f}–{max(norms):.2f} (identity 8) | | | |")


def spiqa(r: dict) -> None:
    for chunk, c in r["chunks"].items():
        print(f"\n{chunk}: baseline {c['baseline']:.2f}")
        print("| setting | BLEU | sparsity |")
        print("|---|---:|---:|")
        for row in c["rows"]:
            print(f"| {row['label']} | {row['metric']:.2f} | {row['sparsity']:.3f} |")


def collaborative(r: dict) -> None:
    print("\n| kind | D~k | BLEU | score error per layer | q/k parameters |")
    print("|---|---:|---:|---|---|")
    for a in r["runs"].values():
        print(f"| {a['kind']} | {a['dk']} | {a['bleu']:.2f} | {', '.join(map(str, a['score_error']))} | "
              f"{a['qk_params_before']:,} → {a['qk_params_after']:,} |")


def main() -> None:
    s = load("mt_story_of_heads.json")
    if s:
        story(s)
        if "analysis" in s:
            analysis(s["analysis"], s)
    m = load("mt_mhr.json")
    if m:
        mhr(m, (s or {}).get("control", {}).get("bleu"))
    q = load("mt_spiqa.json")
    if q:
        spiqa(q)
    c = load("mt_collaborative.json")
    if c:
        collaborative(c)


if __name__ == "__main__":
    main()
