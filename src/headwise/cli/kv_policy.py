"""``headwise kv-policy``: score the heads of a decoder-only LM, keep the ones that need it full, stream the rest,
so that the KV cache fits ``--kv-budget``; writes policy.json, scores.json, summary.json (verdict first) and
report.html."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..errors import HeadwiseError
from . import model_args


def register(verbs, parents) -> None:
    p = verbs.add_parser("kv-policy", parents=parents,
                         help="per-KV-head cache policy (full or sink + window) for a KV-memory budget")
    model_args(p)
    p.add_argument("--kv-budget", type=float, default=0.5, help="share of the full cache's bytes to keep (default 0.5)")
    p.add_argument("--context", type=int, default=2048, help="context length the budget is computed at (default 2048)")
    p.add_argument("--sink", type=int, default=4, help="sink tokens of streaming heads (default 4)")
    p.add_argument("--window", type=int, default=124, help="recent tokens of streaming heads (default 124)")
    p.add_argument("--ranking", default="combined",
                   help="combined, retrieval, copy, induction, echo, outside or random (default combined)")
    p.add_argument("--data", default=None,
                   help="calibration text file, one text a line, for the 'outside' score (default: "
                        "shared/data/wikitext-2/valid.txt when present; none: skip that score)")
    p.add_argument("--calibration-length", type=int, default=512, help="tokens per calibration prompt (default 512)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic calibration prompts")
    p.add_argument("--eval-length", type=int, default=1024, help="passkey prompt length for the check (default 1024)")
    p.add_argument("--eval-keys", type=int, default=1, help="passkeys per depth (5 depths) for the check; 0: skip")
    p.add_argument("--out", default="headwise-kv-policy",
                   help="output folder: policy.json, scores.json, summary.json, report.html")
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    p.set_defaults(run=run)


def _calibration(data: str | None) -> list[str] | None:
    if data == "none":
        return None
    if data is None:
        found = [p / "shared" / "data" / "wikitext-2" / "valid.txt" for p in (Path.cwd(), *Path.cwd().parents)]
        found = [p for p in found if p.is_file()]
        if not found:
            return None
        path = found[0]
    else:
        path = Path(data)
        if not path.is_file():
            raise HeadwiseError(f"calibration file not found: {path} (one text per line)")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = lines[: int(len(lines) * 0.9)] if len(lines) > 10 else lines  # keep the last 10% for evaluation
    return sorted(lines, key=len, reverse=True)[:4]


def load_causal_lm(name: str | None, device: str, dtype: str | None):
    """A causal LM (with its head) and tokenizer, the ``headwise`` attention selected."""
    from transformers import AutoModelForCausalLM

    from ..io import from_pretrained
    from ..models import load_tokenizer, parse_dtype, resolve_model
    from ..runtime import NAME

    if name is None:
        raise HeadwiseError("kv-policy needs --model (a decoder-only LM such as smollm2-135m)")
    path = resolve_model(name)
    config = Path(path).expanduser() / "config.json"
    if path.startswith((os.sep, ".", "~")) and not config.is_file():
        raise HeadwiseError(f"{path} is not a model folder (no config.json); pass a transformers causal LM folder, "
                            "a hub name or smollm2-135m")
    try:
        if config.is_file() and "headwise" in json.loads(config.read_text()):
            model = from_pretrained(path, device=device, dtype=parse_dtype(dtype))
        else:
            model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=NAME, dtype=parse_dtype(dtype))
            model = model.to(device).eval()
    except (OSError, ValueError) as err:
        raise HeadwiseError(f"could not load a causal LM from {name!r}: {str(err).splitlines()[0]}") from err
    tokenizer = load_tokenizer(path)
    tokenizer.model_max_length = getattr(model.config, "max_position_embeddings", 2048)
    return model, tokenizer


def run(args: argparse.Namespace) -> int:
    from ..io import atomic_dir, check_writable_dir
    from ..kvcache import KVPolicy, ScoreConfig, apply_kv_policy, kv_policy, passkey_prompts, remove_kv_policy
    from ..kvcache.config import model_shape
    from ..kvcache.choose import full_heads_for_budget
    from ..kvcache.passkey import passkey_accuracy
    from ..report import Report
    from ..report.kv_policy import add_kv_policy_section

    check_writable_dir(args.out, args.force)
    model, tokenizer = load_causal_lm(args.model, args.device, args.dtype)
    shape = model_shape(model)
    full_heads_for_budget(sum(shape), args.kv_budget, args.context, args.sink, args.window)  # fail before work
    texts = _calibration(args.data)
    config = ScoreConfig(length=args.calibration_length, sink=args.sink, window=args.window, seed=args.seed)
    policy, scores = kv_policy(model, tokenizer, args.kv_budget, args.context, args.sink, args.window, args.ranking,
                               texts=texts, config=config)
    check = {}
    if args.eval_keys > 0:
        prompts = passkey_prompts(tokenizer, args.eval_length, [0.0, 0.25, 0.5, 0.75, 1.0], args.eval_keys,
                                  seed=args.seed + 1000)
        apply_kv_policy(model, KVPolicy.uniform(model))
        check["full"] = passkey_accuracy(model, tokenizer, prompts)
        apply_kv_policy(model, policy)
        check["policy"] = passkey_accuracy(model, tokenizer, prompts)
        remove_kv_policy(model)
    fraction = policy.kv_fraction(args.context)
    verdict = {
        "memory": f"KV cache at {args.context} tokens: {fraction:.0%} of the full cache "
                  f"({1 - fraction:.0%} saved); {policy.describe()}",
        "quality": (f"passkey at ~{args.eval_length} tokens: {check['policy']['correct']}/{check['policy']['prompts']} "
                    f"with the policy vs {check['full']['correct']}/{check['full']['prompts']} with the full cache"
                    if check else "not measured (--eval-keys 0)"),
        "use": f"headwise.apply_kv_policy(model, '{Path(args.out) / 'policy.json'}'); then model.generate(...)",
    }
    summary = {"verdict": verdict, "model": args.model, "kv_budget": args.kv_budget, "context": args.context,
               "kv_fraction": fraction, "sink": args.sink, "window": args.window, "ranking": args.ranking,
               "full_heads": [list(p) for p in policy.full_heads()], "calibration": scores.counts,
               "passkey_check": check}
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        policy.save(tmp / "policy.json")
        (tmp / "scores.json").write_text(json.dumps(scores.to_dict()))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1))
        report = Report("KV cache policy", f"{args.model}, budget {args.kv_budget} at {args.context} tokens")
        add_kv_policy_section(report, summary, scores.to_dict())
        report.write(tmp)
    if args.json:
        print(json.dumps(summary))
    else:
        for line in verdict.values():
            print(line)
        print(f"wrote {args.out}/policy.json, summary.json, scores.json, report.html")
    return 0
