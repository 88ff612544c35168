"""``headwise kv-policy``: score the heads of a decoder-only LM, keep the ones that need it full, stream the rest,
so that the KV cache fits ``--kv-budget``; then tells the user what they got at ``--context`` tokens: the KV bytes the
cache holds, peak memory and decode tokens/s beside the full cache's (``generate()`` in this process), passkey
retrieval of both on a prompt family other than the calibration's, and the ``lm`` task's perplexity through both;
writes policy.json, scores.json, summary.json (verdict first) and report.html.

It needs no data folder: the default ranking calibrates on synthetic prompts, and a text (``--data``, else
shared/data/wikitext-2/valid.txt when there is one) serves only the uses that read text (``data_uses``); without
one, perplexity is skipped with a line saying so and the passkey check runs on the ``numbers`` family. What each input
was used for is printed and recorded (``summary.json``: ``inputs``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import HeadwiseError
from . import model_args, number
from .options import add, alias, output_args
from .constants import PREFILL_CHUNK
from .output import print_json, write_json
from .task_options import load_for_task, model_costs, run_record, task_args, task_from_args


DATA = """--data, an lm text file (default: shared/data/wikitext-2/valid.txt when found): its last 10% measure
perplexity and make the 'text' passkey prompts; the longest lines of its first 90% calibrate --kv-ranking
combined/outside and the 'text' calibration family. The default ranking needs none (synthetic prompts); without
a text, perplexity is skipped."""


def register(verbs, parents) -> None:
    summary = "per-KV-head cache policy (full or sink + window) for a KV-memory budget"
    p = verbs.add_parser("kv-policy", parents=parents, help=summary, description=f"{summary}\n\n" + DATA)
    model_args(p, default="smollm2-135m")
    add(p, "--kv-budget", default=0.5)
    p.add_argument("--context", type=int, default=2048, help="context length the budget is computed at (default 2048)")
    p.add_argument("--sink", type=int, default=4, help="sink tokens of streaming heads (default 4)")
    p.add_argument("--window", type=int, default=None,
                   help="recent tokens of streaming heads (default: 3/4 x kv-budget x context - sink, 764 at 0.5 x "
                        "2048)")
    p.add_argument("--fixed-window", action="store_true",
                   help="keep --window fixed at every length (default: the window scales with the sequence and "
                        "reaches --window at --context, so the budget holds at every length up to it)")
    p.add_argument("--kv-ranking", dest="ranking", default=None,
                   help="retrieval, combined, copy, induction, echo, outside or random (default retrieval; combined "
                        "and outside calibrate on prompts of at least twice sink + window); --scores learned ranks "
                        "by the learned gates")
    alias(p, "--ranking", "--kv-ranking", "ranking")
    p.add_argument("--scores", default="training-free", choices=["training-free", "learned"],
                   help="training-free head scores (one forward per calibration prompt, the default) or learned: a "
                        "DuoAttention-style gate per KV head trained on synthetic passkey prompts, model frozen")
    p.add_argument("--gate-steps", type=int, default=500, help="--scores learned: Adam steps, one prompt each")
    p.add_argument("--gate-lr", type=float, default=0.02, help="--scores learned: learning rate of the gates")
    p.add_argument("--gate-l1", type=float, default=0.05, help="--scores learned: weight of mean(alpha) in the loss")
    p.add_argument("--gate-length", type=int, default=1024, help="--scores learned: tokens per training prompt")
    p.add_argument("--gate-region", default="answer", choices=["answer", "all"],
                   help="--scores learned: distil the last hidden states on the positions that predict the key "
                        "(answer, the default) or on every position (all)")
    p.add_argument("--gate-haystack", default="filler", choices=["filler", "text"],
                   help="--scores learned: haystack of repeated filler sentences (default) or the --data text")
    p.add_argument("--calibration-length", type=int, default=None,
                   help="tokens per calibration prompt (default 512; with --kv-ranking combined or outside, at least "
                        "twice sink + window)")
    add(p, "--seed", default=0)
    p.add_argument("--calibration-families", default="filler",
                   help="comma-separated passkey prompt families the retrieval scores are measured on: a haystack "
                        "(filler, text: the --data text, numbers) with -chat, -raw or nothing (the tokenizer's chat "
                        "template when it has one); default filler")
    p.add_argument("--eval-family", default=None,
                   help="prompt family of the passkey check (default text: running text from the evaluated part of "
                        "--data, a family the default calibration never saw; numbers when there is no text)")
    p.add_argument("--eval-length", type=int, default=None,
                   help="passkey prompt length for the check (default: --context)")
    p.add_argument("--eval-keys", type=int, default=1, help="passkeys per depth (5 depths) for the check; 0: skip")
    p.add_argument("--no-measure", action="store_true",
                   help="skip the measurements through generate(): KV bytes held, peak memory, decode speed and the "
                        "passkey check of the full cache and the policy")
    p.add_argument("--measure-new", type=int, default=32,
                   help="tokens generated after a --context-token prompt to time decoding (default 32)")
    p.add_argument("--measure-repeats", type=int, default=1,
                   help="interleaved repeats of the full cache and the policy (medians; default 1)")
    p.add_argument("--prefill-chunk", type=prefill_chunk_arg, default=PREFILL_CHUNK,
                   help=f"tokens per prefill forward of generate() under the policy (default {PREFILL_CHUNK}: 512 on "
                        "a CPU, the lowest peak measured there; on a GPU 1k-8k tokens or the whole prompt, by free "
                        "memory; docs/kv-policy.md); 0: the whole prompt at once")
    p.add_argument("--no-perplexity", action="store_true", help="skip the perplexity through the cache")
    add(p, "--task", default="lm", shown="lm, the only task kv-policy measures (perplexity through the cache)")
    task_args(p, task="lm")  # --data, --split, --max-length (default: --context), --stride, --max-tokens
    output_args(p, "headwise-kv-policy", "policy.json, scores.json, summary.json, report.html and, with --save-model, "
                "model/")
    add(p, "--save-model")
    p.set_defaults(run=run)


def prefill_chunk_arg(value: str) -> int | str:
    """``--prefill-chunk``: ``auto`` or a number of tokens ≥ 0 (0: the whole prompt)."""
    return value if value == "auto" else number(int, positive=False)(value)


def lm_task(args: argparse.Namespace, data: str | None):
    """The ``lm`` task of the command line on ``data`` (windows of ``--max-length``, default ``--context`` tokens);
    its data is checked when there is some."""
    if args.max_length is None:
        args.max_length = args.context
    args.data = data
    return task_from_args(args, "lm", check=data is not None)


def text_source(args: argparse.Namespace) -> str | None:
    """The text of the run: ``--data``, else shared/data/wikitext-2/valid.txt when there is one, else None."""
    from ..tasks.paths import shared_data

    if args.data is not None:
        return args.data
    try:
        return str(shared_data("wikitext-2/valid.txt", "--data FILE"))
    except HeadwiseError:
        return None


PERPLEXITY = "perplexity (its last 10%)"
PASSKEY = "the passkey check and the measured prompt ('text' family, its last 10%)"


def data_uses(args: argparse.Namespace, families: tuple[str, ...], gates) -> dict[str, bool]:
    """What a text is read for under these options → whether the user asked for it explicitly (a use asked for
    needs a text; the others are skipped, or take another prompt family, without one)."""
    uses = {}
    if args.ranking in ("combined", "outside"):
        uses[f"calibration of --kv-ranking {args.ranking} (the longest lines of its first 90%)"] = True
    if any(name.startswith("text") for name in families):
        uses["the 'text' calibration prompts (--calibration-families)"] = True
    if gates is not None and gates.haystack == "text":
        uses["the learned gates' haystack (--gate-haystack text)"] = True
    if not args.no_measure and (args.eval_family or "text").startswith("text"):
        uses[PASSKEY] = args.eval_family is not None
    if not args.no_perplexity:
        uses[PERPLEXITY] = False
    return uses


def inputs_line(data: str | None, uses: dict[str, bool], ranking: str) -> str:
    """One line on what the text was used for (or that there was none, and what that changed)."""
    if data is None:
        return "; ".join(["no text (--data) given and shared/data/wikitext-2/valid.txt not found: the ranking "
                          "calibrates on synthetic prompts"]
                         + (["perplexity skipped"] if PERPLEXITY in uses else [])
                         + (["the passkey check uses the 'numbers' family"] if PASSKEY in uses else []))
    if not uses:
        return f"--data {data} is not used by these options (--kv-ranking {ranking} calibrates on synthetic prompts)"
    return f"--data {data} is used only for {'; '.join(uses)} with --kv-ranking {ranking}"


def calibration_texts(task, count: int = 4) -> list[str]:
    """The ``count`` longest lines of the task's calibration part (the first 90% of the text)."""
    return sorted((line.strip() for line in task.texts("calibration") if line.strip()), key=len, reverse=True)[:count]


def perplexities(model, tokenizer, task, policy) -> dict:
    """The task's perplexity with the full cache and through ``policy`` (every window one prefill through it)."""
    from ..kvcache import KVPolicy, policy_forward

    out = {}
    for name, rules in (("full", KVPolicy.uniform(model)), ("policy", policy)):
        with policy_forward(model, rules):
            out[name] = task.evaluate(model, tokenizer)
    return out


def measured_line(measured: dict | None) -> str:
    """The verdict's line on what ``generate()`` measured (``kvcache.measure.measure_policy``)."""
    if measured is None:
        return "KV bytes held, peak memory and decode speed not measured (--no-measure)"
    mib = 2 ** 20
    full, policy, ratio = measured["full"], measured["policy"], measured["ratio"]
    peak = ("peak memory not measured on this platform" if ratio["peak_memory_above_start"] is None else
            f"peak {measured['memory']} above the start of generate() {policy['peak_memory_above_start'] / mib:.0f} "
            f"vs {full['peak_memory_above_start'] / mib:.0f} MiB ({ratio['peak_memory_above_start']:.2f}x)")
    return (f"measured with generate() at {measured['prompt_tokens']} prompt tokens + {measured['new_tokens']} new "
            f"on {measured['device']} ({measured['threads']} threads, {measured['repeats']} run(s) each, whatever "
            f"else the machine was doing): KV held {policy['kv_bytes'] / mib:.1f} vs {full['kv_bytes'] / mib:.1f} "
            f"MiB ({ratio['kv_bytes']:.2f}x); {peak}; decode {policy['decode_tokens_per_s']:.1f} vs "
            f"{full['decode_tokens_per_s']:.1f} tokens/s ({ratio['decode_tokens_per_s']:.2f}x); prefill "
            f"{policy['prefill_s']:.2f} vs {full['prefill_s']:.2f} s — policy vs full cache")


def gate_config(args: argparse.Namespace):
    """The ``KVGateConfig`` of ``--scores learned`` (None otherwise); checked before the model loads."""
    from ..kvcache import KVGateConfig

    if args.scores != "learned":
        args.ranking = args.ranking or "retrieval"
        return None
    if args.ranking not in (None, "learned"):
        raise HeadwiseError(f"--scores learned ranks by the learned gates; drop --kv-ranking {args.ranking}")
    args.ranking = "learned"
    config = KVGateConfig(steps=args.gate_steps, lr=args.gate_lr, l1=args.gate_l1, length=args.gate_length,
                          sink=args.sink, window=args.window, region=args.gate_region, haystack=args.gate_haystack,
                          seed=args.seed)
    config.check()
    return config


def run(args: argparse.Namespace) -> int:
    from ..io import atomic_dir, check_writable_dir, save_pretrained
    from ..kvcache import KVPolicy, ScoreConfig, apply_kv_policy, kv_policy, remove_kv_policy
    from ..kvcache.config import model_shape
    from ..kvcache.choose import calibration_length, default_window, full_heads_for_budget
    from ..kvcache.measure import measure_policy
    from ..kvcache.passkey import PromptFamily, family_prompts, passkey_accuracy
    from ..report import Report
    from ..report.kv_policy import add_kv_policy_section

    if args.task != "lm":
        raise HeadwiseError(f"--task {args.task}: kv-policy measures a decoder-only KV cache, on the lm task only")
    check_writable_dir(args.out, args.force)
    if args.window is None:
        args.window = default_window(args.kv_budget, args.context, args.sink)
    families = tuple(PromptFamily.parse(name.strip()).name for name in args.calibration_families.split(","))
    args.eval_length = args.eval_length or args.context
    prefill_chunk = args.prefill_chunk or None  # 0: the whole prompt
    if args.measure_new < 2 or args.measure_repeats < 1:
        raise HeadwiseError(f"--measure-new {args.measure_new} / --measure-repeats {args.measure_repeats}: decode "
                            "speed needs at least 2 new tokens and 1 repeat (or --no-measure)")
    gates = gate_config(args)
    data, uses = text_source(args), data_uses(args, families, gates)
    if data is None:
        if args.eval_family is None:
            args.eval_family = "numbers"
        needed = [use for use, asked in uses.items() if asked]
        if needed:
            raise HeadwiseError(f"{needed[0]} needs a text and none was given (shared/data/wikitext-2/valid.txt was "
                                "not found either): pass --data FILE (a UTF-8 text file)")
        args.no_perplexity = True
    eval_family = PromptFamily.parse(args.eval_family or "text")
    task = lm_task(args, data)  # bad data fails before the model loads
    model, tokenizer = load_for_task(args, task)
    print(f"headwise: {inputs_line(data, uses, args.ranking)}", file=sys.stderr)  # once the inputs are known good
    tokenizer.model_max_length = getattr(model.config, "max_position_embeddings", tokenizer.model_max_length)
    shape = model_shape(model)
    full_heads_for_budget(sum(shape), args.kv_budget, args.context, args.sink, args.window,
                          not args.fixed_window)  # fail before work
    texts = calibration_texts(task) if data is not None else None
    if gates is not None and gates.haystack == "text":  # the gates' haystack: the whole calibration part
        texts = [line for line in task.texts("calibration") if line.strip()]
    length = args.calibration_length or calibration_length(args.ranking, args.sink, args.window)
    config = ScoreConfig(length=length, sink=args.sink, window=args.window, seed=args.seed, families=families)
    learned = None
    if gates is not None:  # through the shared Trainer (data-parallel under torchrun), then ranked like any score
        from ..sites import find_sites
        from ..training import train_kv_gates

        heads = next(site for site in find_sites(model) if site.kind == "dec-self").num_heads
        learned = train_kv_gates(model, tokenizer, gates, texts=texts).scores(heads)
    policy, scores = kv_policy(model, tokenizer, args.kv_budget, args.context, args.sink, args.window, args.ranking,
                               texts=texts, config=config, scores=learned, scaled=not args.fixed_window)
    check, measured = {}, None
    eval_text = "\n".join(line for line in task.texts("eval") if line.strip()) if data is not None else None
    if not args.no_measure:
        measure_ids = family_prompts(tokenizer, eval_family, args.context, [0.5], 1, args.seed + 1000,
                                     eval_text)[0].ids
        measured = measure_policy(model, measure_ids, policy, args.measure_new, args.measure_repeats,
                                  pad_token_id=tokenizer.eos_token_id, prefill_chunk=prefill_chunk)
    if args.eval_keys > 0 and not args.no_measure:
        prompts = family_prompts(tokenizer, eval_family, args.eval_length, [0.0, 0.25, 0.5, 0.75, 1.0],
                                 args.eval_keys, args.seed + 1000, eval_text)
        for name, rules in (("full", KVPolicy.uniform(model)), ("policy", policy)):
            apply_kv_policy(model, rules, prefill_chunk=prefill_chunk)
            check[name] = passkey_accuracy(model, tokenizer, prompts)
        remove_kv_policy(model)
        check["family"], check["length"] = eval_family.name, int(max(len(p.ids) for p in prompts))
    ppl = None if args.no_perplexity else perplexities(model, tokenizer, task, policy)
    fraction = policy.kv_fraction(args.context)
    calibrated_on = (f"learned gates (haystack {gates.haystack})" if gates is not None else "none (--kv-ranking random)"
                     if args.ranking == "random" else f"synthetic passkey prompts ({', '.join(config.families)}) and "
                     "repeated random tokens" + (f" + {scores.counts.get('calibration', 0)} lines of {data}"
                                                 if args.ranking in ("combined", "outside") else ""))
    verdict = {
        "memory": f"KV cache at {args.context} tokens: {fraction:.0%} of the full cache "
                  f"({1 - fraction:.0%} saved); {policy.describe()}",
        "measured": measured_line(measured),
        "quality": (f"passkey ({check['family']} prompts, up to {check['length']} tokens): "
                    f"{check['policy']['correct']}/{check['policy']['prompts']} with the policy vs "
                    f"{check['full']['correct']}/{check['full']['prompts']} with the full cache"
                    if check else "passkey not measured (--no-measure or --eval-keys 0)")
                   + (f"; perplexity {ppl['policy']['perplexity']:.2f} through the policy vs "
                      f"{ppl['full']['perplexity']:.2f} with the full cache ({ppl['policy']['tokens']:,} tokens of "
                      f"{task.source()}, {task.max_length}-token windows)" if ppl else ""),
        "use": f"headwise.apply_kv_policy(model, '{Path(args.out) / 'policy.json'}', prefill_chunk={prefill_chunk!r}); "
               "then model.generate(...)",
    }
    summary = {"verdict": verdict, "model": args.model, "kv_budget": args.kv_budget, "context": args.context,
               "kv_fraction": fraction, "kv_fraction_at": {str(n): share for n, share in policy.savings().items()},
               "prefill_chunk": prefill_chunk, "sink": args.sink, "window": args.window, "ranking": args.ranking,
               "scores": args.scores, "gates": None if gates is None else vars(gates),
               "full_heads": [list(p) for p in policy.full_heads()], "calibration": scores.counts,
               "calibration_families": list(config.families), "measured": measured, "passkey_check": check,
               "perplexity": ppl,
               "inputs": {"data": data, "data_used_for": list(uses) if data is not None else [],
                          "calibration": calibrated_on, "perplexity": None if ppl is None else f"the last 10% of {data}",
                          "passkey_check": None if not check else f"{check['family']} prompts"},
               **run_record(task, None if ppl is None else ppl["full"][task.metric],
                            None if ppl is None else ppl["policy"][task.metric], None, model_costs(model), model)}
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        if args.save_model:
            apply_kv_policy(model, policy)
            save_pretrained(model, tmp / "model", tokenizer=tokenizer)
        policy.save(tmp / "policy.json")
        write_json(tmp / "scores.json", scores.to_dict())
        write_json(tmp / "summary.json", summary, indent=1)
        report = Report("KV cache policy", f"{args.model}, budget {args.kv_budget} at {args.context} tokens")
        add_kv_policy_section(report, summary, scores.to_dict())
        report.write(tmp)
    if args.json:
        print_json(summary)
    else:
        for line in verdict.values():
            print(line)
        print(f"wrote {args.out}/policy.json, summary.json, scores.json, report.html")
    return 0
