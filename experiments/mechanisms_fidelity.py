"""Fidelity of every mechanism (and option) on real attention inputs: relative error against exact softmax.

Queries, keys and values (after the model's own projections and rotary embeddings) are captured at a few layers of
the packaged MiniLM (bidirectional, WikiText-2 validation text) and of SmolLM2-135M (causal, same text) by
attaching the exact ``softmax`` mechanism and hooking its op. Each mechanism then runs on the captured tensors in
evaluation mode (random ones at their seed's draw) and the error ``‖out − softmax‖_F / ‖softmax‖_F`` over real query
rows is averaged over the captured layers. With ``--perplexity``, every causal mechanism is also swapped into all
30 sites of SmolLM2 (its pretrained weights, no training) and the language-model perplexity on the same tokens is
reported next to softmax's (``--perplexity N``: on the first N sequences). Writes ``experiments/mechanisms_fidelity.json`` and prints markdown tables (the ones in
docs/mechanisms.md).

    python experiments/mechanisms_fidelity.py [--tokens 256] [--sequences 2] [--no-causal] [--perplexity SEQUENCES]
        [--data valid.txt] [--device cuda]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.integrations.sdpa_attention import repeat_kv

import common
from headwise.mechanisms import apply, build_core, mechanisms_of, remove
from headwise.mechanisms.dropin import key_keep
from headwise.models import load_model
from headwise.sites import find_sites

OUT = common.EXPERIMENTS / "mechanisms_fidelity.json"

BIDIRECTIONAL = [  # (label, mechanism, args), sizes well below the 256-token inputs so that all approximate
    ("local w=32", "local", {"window": 32}),
    ("local block w=32", "local", {"window": 32, "mode": "block"}),
    ("local block w=32 overlap=16", "local", {"window": 32, "mode": "block", "overlap": 16}),
    ("linear elu", "linear", {}),
    ("linear relu", "linear", {"feature_map": "relu"}),
    ("linear dpfp ν=2", "linear", {"feature_map": "dpfp", "dpfp_nu": 2}),
    ("cosformer", "cosformer", {}),
    ("performer m=64", "performer", {"features": 64}),
    ("performer m=256", "performer", {"features": 256}),
    ("rfa m=64 (cosine kernel)", "rfa", {"features": 64}),
    ("nystrom m=32", "nystrom", {"landmarks": 32}),
    ("ra (1 sample)", "ra", {}),
    ("lara C=32 mis=opt", "lara", {"num_landmarks": 32}),
    ("lara C=32 mis=bh", "lara", {"num_landmarks": 32, "mis": "bh"}),
    ("eva w=32 C=16 proposal=query", "eva", {"window": 32, "num_chunks": 16}),
    ("eva w=32 C=16 proposal=key", "eva", {"window": 32, "num_chunks": 16, "proposal": "key"}),
    ("eva w=32 C=16 proposal=uniform", "eva", {"window": 32, "num_chunks": 16, "proposal": "uniform"}),
    ("eva-paper w=32 C=16 adaptive=mean", "eva-paper", {"window": 32, "num_landmarks": 16, "adaptive": "mean"}),
    ("eva-paper w=32 C=16 overlap=8 adaptive=mean", "eva-paper",
     {"window": 32, "num_landmarks": 16, "overlap": 8, "adaptive": "mean"}),
    ("eva-paper w=32 C=16 adaptive=default (untrained)", "eva-paper", {"window": 32, "num_landmarks": 16}),
    ("scatterbrain block w=32 m=64", "scatterbrain", {"window": 32, "features": 64}),
    ("scatterbrain sliding w=32 m=64", "scatterbrain", {"window": 32, "features": 64, "mode": "sliding"}),
]
CAUSAL = [
    ("local w=32", "local", {"window": 32}),
    ("local block w=32", "local", {"window": 32, "mode": "block"}),
    ("linear elu", "linear", {}),
    ("linear relu", "linear", {"feature_map": "relu"}),
    ("cosformer", "cosformer", {}),
    ("performer m=64", "performer", {"features": 64}),
    ("performer m=256", "performer", {"features": 256}),
    ("eva w=32 c=8 proposal=query", "eva", {"window": 32, "chunk_size": 8}),
    ("eva w=32 c=8 proposal=key", "eva", {"window": 32, "chunk_size": 8, "proposal": "key"}),
    ("eva w=32 c=8 proposal=uniform", "eva", {"window": 32, "chunk_size": 8, "proposal": "uniform"}),
    ("scatterbrain block w=32 m=64", "scatterbrain", {"window": 32, "features": 64}),
    ("scatterbrain sliding w=32 m=64", "scatterbrain", {"window": 32, "features": 64, "mode": "sliding"}),
]


def texts(tokenizer, text: Path, sequences: int, tokens: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """``sequences`` windows of ``tokens`` tokens of WikiText-2 validation text (the first lines, in order)."""
    words = " ".join(line.strip() for line in text.read_text().splitlines() if line.strip() and not
                     line.strip().startswith("="))
    ids = tokenizer(words[: 40 * tokens * sequences], add_special_tokens=False)["input_ids"]
    batch = torch.tensor(ids[: sequences * tokens]).view(sequences, tokens).to(device)
    return {"input_ids": batch, "attention_mask": torch.ones_like(batch)}


@torch.no_grad()
def capture(model, inputs: dict, layers: list[int]) -> list[dict]:
    """``q, k, v [B, H, T, d]`` (key/value heads expanded), key mask, scaling and causality at ``layers``."""
    ops = apply(model, "softmax")
    paths = list(ops)
    captured = []

    def hook(_op, args):
        _module, q, k, v, keep, scaling, _dropout, causal = args
        groups = q.shape[1] // k.shape[1]
        captured.append({"q": q, "k": repeat_kv(k, groups), "v": repeat_kv(v, groups), "causal": causal,
                         "keep": key_keep(keep, q.shape[0], q.shape[2], causal), "scaling": scaling})

    handles = [mechanisms_of(model)[paths[i]].register_forward_pre_hook(hook) for i in layers]
    try:
        model(**inputs)
    finally:
        for h in handles:
            h.remove()
        remove(model)
    return captured


def relative_error(name: str, args: dict, site: dict) -> float:
    torch.manual_seed(0)
    core = build_core(name, site["q"].shape[1], site["q"].shape[-1], **args).eval()
    exact = build_core("softmax", site["q"].shape[1], site["q"].shape[-1])
    run = lambda c: c.run(site["q"], site["k"], site["v"], site["keep"], site["causal"], site["scaling"])  # noqa: E731
    ref, out = run(exact), run(core)
    real = slice(None) if site["keep"] is None else site["keep"][:, None, :, None].expand_as(ref)
    return ((out - ref)[real].norm() / ref[real].norm()).item()


def evaluate(model_name: str, configs: list, text: Path, sequences: int, tokens: int, device: str = "cpu") -> dict:
    model, tokenizer = load_model(model_name, device=device)
    inputs = texts(tokenizer, text, sequences, tokens, device)
    n_layers = len(find_sites(model))
    layers = sorted({0, n_layers // 2, n_layers - 1})
    sites = capture(model, inputs, layers)
    results = {"model": model_name, "layers": layers, "sequences": sequences, "tokens": tokens,
               "causal": bool(sites[0]["causal"]), "errors": {}}
    for label, name, args in tqdm(configs, desc=model_name, unit="mechanism"):
        errors = [relative_error(name, args, s) for s in sites]
        results["errors"][label] = {"mechanism": name, "args": args, "per_layer": errors,
                                    "mean": sum(errors) / len(errors)}
    return results


@torch.no_grad()
def perplexities(configs: list, text: Path, sequences: int, tokens: int, device: str = "cpu") -> dict:
    """Zero-shot perplexity of SmolLM2 with each causal mechanism at every site (softmax first)."""
    from transformers import AutoModelForCausalLM

    from headwise.models import load_tokenizer, resolve_model
    from headwise.runtime.attention import NAME

    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), attn_implementation=NAME)
    model = model.to(device).eval()
    inputs = texts(load_tokenizer("smollm2-135m"), text, sequences, tokens, device)
    out = {}
    for label, name, args in tqdm([("softmax", "softmax", {})] + configs, desc="perplexity", unit="mechanism"):
        torch.manual_seed(0)
        apply(model, name, replace=True, **args)
        model.eval()
        loss = model(**inputs, labels=inputs["input_ids"]).loss.item()
        out[label] = {"mechanism": name, "args": args, "perplexity": float(torch.tensor(loss).exp())}
        remove(model)
    return out


def table(runs: list[dict]) -> str:
    lines = []
    for run in runs:
        kind = "causal" if run["causal"] else "bidirectional"
        lines += [f"**{run['model']}** ({kind}; {run['sequences']} × {run['tokens']} WikiText-2 tokens, layers "
                  f"{', '.join(map(str, run['layers']))})", "",
                  "| mechanism | " + " | ".join(f"layer {i}" for i in run["layers"]) + " | mean |",
                  "|---|" + "---|" * (len(run["layers"]) + 1)]
        for label, rec in run["errors"].items():
            lines.append(f"| {label} | " + " | ".join(f"{e:.3f}" for e in rec["per_layer"]) + f" | {rec['mean']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--sequences", type=int, default=2)
    parser.add_argument("--no-causal", action="store_true", help="skip SmolLM2 (the causal model)")
    parser.add_argument("--perplexity", type=int, default=0, metavar="SEQUENCES",
                        help="also SmolLM2's perplexity with each mechanism, on this many sequences (0: skip)")
    common.add_data(parser, common.WIKITEXT, "WikiText-2 valid.txt")
    common.add_device(parser)
    parser.add_argument("--out", type=Path, default=OUT, help="the results JSON (replaced)")
    args = parser.parse_args()
    text = common.data_file(args.data, common.WIKITEXT)
    torch.set_grad_enabled(False)
    start = time.time()
    runs = [evaluate("minilm", BIDIRECTIONAL, text, args.sequences, args.tokens, args.device)]
    if not args.no_causal:
        runs.append(evaluate("smollm2-135m", CAUSAL, text, args.sequences, args.tokens, args.device))
    ppl = perplexities(CAUSAL, text, args.perplexity, args.tokens, args.device) \
        if args.perplexity and not args.no_causal else None
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    payload = {"script": "experiments/mechanisms_fidelity.py", "args": settings, "torch": torch.__version__,
               "seconds": round(time.time() - start, 1), "runs": runs, "perplexity": ppl}
    common.save_results(args.out, payload)
    print(table(runs))
    if ppl:
        print("| mechanism in all SmolLM2 sites | perplexity |\n|---|---|")
        print("\n".join(f"| {label} | {rec['perplexity']:.2f} |" for label, rec in ppl.items()))


if __name__ == "__main__":
    main()
