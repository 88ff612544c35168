"""``headwise eval TASK``: a model's metrics on a task — ``stsb`` (Spearman, mean pooling, cosine), ``lm``
(perplexity), ``translation`` (sacreBLEU), ``classification`` (accuracy, F1, Matthews or Pearson/Spearman).

A KV policy acts only on the cache that ``generate()`` builds, which a full forward never does: ``eval lm`` on a
model with one measures through the policy's cache (``kvcache.policy_forward``, as ``headwise kv-policy`` measures
its perplexity), and the other tasks say plainly that their forward ignores it."""

from __future__ import annotations

import argparse
from contextlib import nullcontext

from . import model_args
from .options import add
from .task_options import dispatch_of, load_for_task, metric_line, task_args, task_from_args
from .output import print_json

HELP = {"lm": "perplexity of a causal LM on a text (strided windows)",
        "translation": "sacreBLEU of an encoder-decoder (greedy or beam search)",
        "classification": "accuracy, F1, Matthews (or Pearson/Spearman) of a sequence classifier",
        "long": "RULER-style long-context suite of a causal LM: retrieval, multi-hop, aggregation, QA"}


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "eval": ("headwise eval stsb --limit 500",
             "headwise eval lm --model smollm2-135m --max-length 256 --max-tokens 2048",
             "headwise eval translation --model multi30k-marian-de-en --limit 100",
             "headwise eval classification --model DIR/model --data genre.csv"),
    "eval stsb": ("headwise eval stsb --limit 500",
                  "headwise eval stsb --model DIR/model --split test"),
    "eval lm": ("headwise eval lm --model smollm2-135m --max-length 256 --max-tokens 2048",
                "headwise eval lm --model smollm2-135m --data my.txt --max-length 512"),
    "eval translation": ("headwise eval translation --model multi30k-marian-de-en --limit 100",
                         "headwise eval translation --model DIR/model --src-file de.txt --tgt-file en.txt --beam 4"),
    "eval long": ("headwise eval long --model smollm2-135m --lengths 2k --samples 4",
                  "headwise eval long --model smollm2-135m --lengths 2k --haystack prose,docs,code --samples 4",
                  "headwise eval long --model smol-kv/model --lengths 2k,4k --data my.txt --out smol-long"),
    "eval classification": ("headwise eval classification --model DIR/model --data genre.csv",
                            "headwise eval classification --model DIR/model --data glue:sst2 --limit 200"),
}


def register(verbs, parents) -> None:
    evaluate = verbs.add_parser("eval", parents=parents, help="score a model on a task: stsb, lm, translation, "
                                                              "classification, long")
    tasks = evaluate.add_subparsers(dest="task", required=True, metavar="TASK")
    stsb = tasks.add_parser("stsb", parents=parents, help="STS Benchmark Spearman (mean pooling, cosine)")
    model_args(stsb)
    add(stsb, "--split", default="dev")
    add(stsb, "--data", default=None, shown="shared/data/stsb")
    add(stsb, "--batch-size", default=64)
    add(stsb, "--limit", default=None)
    stsb.set_defaults(run=run_stsb)
    for name, text in HELP.items():
        sub = tasks.add_parser(name, parents=parents, help=text)
        model_args(sub)
        task_args(sub, task=name)
        sub.set_defaults(run=run_task)
        if name == "long":  # OUT keeps the per-sample log (resumable), results.json and report.html
            add(sub, "--out", default=None)
            add(sub, "--resume")
            add(sub, "--force")
            sub.set_defaults(run=run_long)


# How a task's metric was measured (the ``measured`` key of --json, and a line of the text output).
MEASURED = {
    "forward": "a full forward (the model as it computes)",
    "kv_policy": "through the model's KV policy cache: each window one prefill in which every KV head keeps only "
                 "what its rule keeps (as headwise kv-policy measures it)",
    "kv_policy_ignored": "a full forward, which ignores the model's KV policy (it acts only on generate()'s cache): "
                         "the score is the full cache's",
    "cache": "through the cache generate() builds for the model (its KV policy's, its latent cache or the default): "
             "each context prefilled once, each question answered greedily after it",
}


def measured_way(model, task) -> str:
    """The key of ``MEASURED`` for ``task`` on ``model``: through its KV policy for ``lm``, else a full forward
    (said to ignore a policy the model carries)."""
    from ..kvcache import policy_of

    if task.name == "long":
        return "cache"
    if policy_of(model) is None:
        return "forward"
    return "kv_policy" if task.name == "lm" else "kv_policy_ignored"


def run_task(args: argparse.Namespace) -> int:
    from ..kvcache import policy_forward

    task = task_from_args(args, args.task)  # bad data fails before the model loads
    model, tokenizer = load_for_task(args, task)
    measured = measured_way(model, task)
    with policy_forward(model) if measured == "kv_policy" else nullcontext():
        metrics = task.evaluate(model, tokenizer)
    subset = next((f"--{flag.replace('_', '-')} {getattr(task, flag)}" for flag in ("limit", "max_tokens")
                   if getattr(task, flag, None) is not None), None)
    if args.json:
        print_json(metrics | {"measured": measured} | ({"subset": subset} if subset else {}), indent=2)
    else:
        print(f"{task.name}: {args.model or 'all-MiniLM-L6-v2 (packaged)'} ({type(model).__name__})")
        print(f"  {metric_line(task, metrics)}"
              + (f"  [on a subset ({subset}): not comparable with full-split scores]" if subset else ""))
        print(f"  measured {MEASURED[measured]}")
    return 0


def run_long(args: argparse.Namespace) -> int:
    from ..report.long import SAMPLES_FILE, long_lines, write_long_run
    from ..tasks.long import open_log

    task = task_from_args(args, "long")  # bad --lengths, --haystack or --data fail before the model loads
    log_path = None if args.out is None else open_log(args.out, args.resume, args.force)
    model, tokenizer = load_for_task(args, task)
    name = args.model or "all-MiniLM-L6-v2 (packaged)"
    result = task.evaluate(model, tokenizer, log=None if log_path is None else task.log(log_path, model, name))
    result |= {"measured": measured_way(model, task)}
    if args.out is not None:
        write_long_run(args.out, result, name)
    if args.json:
        print_json(result, indent=2)
    else:
        print("\n".join(long_lines(result, f"{name} ({type(model).__name__})")))
        print(f"  measured {MEASURED[result['measured']]}" + (f"; {args.out}/report.html, {args.out}/{SAMPLES_FILE}"
                                                               if args.out else ""))
    return 0


def run_stsb(args: argparse.Namespace) -> int:
    from ..models import load_model, load_tokenizer
    from ..tasks import Stsb, ensure_encoder, evaluate_stsb

    # a missing or malformed file, or too few pairs for a correlation, fails before the model loads
    Stsb(data=args.data, split=args.split, limit=args.limit).check()
    model, _ = load_model(args.model, args.device, args.dtype, with_tokenizer=False, **dispatch_of(args))
    ensure_encoder(model, "eval stsb")  # a decoder is refused first: the clearer reason
    tokenizer = load_tokenizer(args.model, model)
    result = evaluate_stsb(model, tokenizer, args.split, args.data, args.batch_size, args.limit)
    if args.json:
        print_json(result.as_dict(), indent=2)
    else:
        subset = (f"first {result.pairs} of {result.total_pairs} pairs (--limit {args.limit}): a subset, not "
                  "comparable with full-split scores") if result.total_pairs else f"{result.pairs} pairs"
        print(f"STS-B {result.split} ({subset}, {result.file})")
        print(f"  model: {args.model or 'all-MiniLM-L6-v2 (packaged)'}, attention: {model.config._attn_implementation}")
        print(f"  Spearman x100: {result.spearman:.2f}   Pearson x100: {result.pearson:.2f}")
    return 0
