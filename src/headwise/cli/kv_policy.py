"""``headwise kv-policy``: the KV-policy experiment (``headwise.workflows.kv_policy``, callable from Python): score
the heads of a decoder-only LM, keep the ones that need it full, stream the rest, so that the KV cache fits
``--kv-budget``; then tells the user what they got at ``--context`` tokens: the KV bytes the cache holds, peak memory
and decode tokens/s beside the full cache's (``generate()`` in this process), the long-context suite's retrieval
and QA subset through both on the same samples (``--check suite``, drawn apart from the calibration: its own seed
and needle formats, on natural prose and on ``--data`` when given, with the retention per haystack; ``--check passkey``: passkeys on a prompt family other than the calibration's), and
the ``lm`` task's perplexity through both; writes policy.json,
scores.json, summary.json (verdict first) and report.html.

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
perplexity and make the 'text' passkey prompts; its first 90% makes the 'text' calibration family and, when given
as --data, calibrates the 'outside' score of rankings that read it (retrieval+lookup+outside, combined) beside
passages of Python's own documentation and source (what they calibrate on without --data; never the check's
prose). The default ranking needs no text (synthetic prompts); without a text, perplexity is skipped."""


# what each page of this verb shows under "examples:" (tests/test_cli_help.py parses every line)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "kv-policy": ("headwise kv-policy --kv-budget 0.5 --out smol-kv   # smollm2-135m, synthetic calibration",
                  "headwise kv-policy --model smollm2-135m --kv-budget 0.5 --context 8192 --data my.txt "
                  "--out smol-kv8k"),
}


def register(verbs, parents) -> None:
    summary = "per-KV-head cache policy (full or sink + window) for a KV-memory budget"
    p = verbs.add_parser("kv-policy", parents=parents, help=summary, description=f"{summary}\n\n" + DATA)
    model_args(p, default="smollm2-135m")
    add(p, "--kv-budget", default=0.5)
    p.add_argument("--context", type=int, default=2048, help="context length the budget is computed at (default 2048)")
    p.add_argument("--sink", type=int, default=4, help="sink tokens of streaming heads (default 4)")
    p.add_argument("--window", type=int, default=None,
                   help="recent tokens of streaming heads (default: 0.25 x kv-budget x context - sink, 252 at 0.5 x "
                        "2048; a wider window keeps perplexity closer, a narrower one keeps more heads full)")
    p.add_argument("--fixed-window", action="store_true",
                   help="keep --window fixed at every length (default: the window scales with the sequence and "
                        "reaches --window at --context, so the budget holds at every length up to it)")
    p.add_argument("--kv-ranking", dest="ranking", default=None,
                   help="retrieval+lookup (the default: passkey retrieval + fact lookup), retrieval+lookup+outside "
                        "(also the attention mass a streaming head drops on natural text: Python's documentation "
                        "and source, and --data when given), combined, retrieval, copy, lookup, induction, echo, "
                        "outside, random, or a sum of scores such as copy+lookup; --scores learned ranks by the "
                        "learned gates")
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
                   help="comma-separated prompt families the retrieval and lookup scores are measured on: a haystack "
                        "(filler, text: the --data text, numbers) with -chat, -raw or nothing (the tokenizer's chat "
                        "template when it has one); default filler")
    p.add_argument("--check", default="suite", choices=["suite", "passkey"],
                   help="how the policy is checked against the full cache on the same prompts: suite, the long-context "
                        "suite's retrieval and QA tasks at --context tokens on natural prose (the prose haystack) and "
                        "on --data when given (its own seed and needle formats, never the calibration's; the verdict "
                        "gives the retention, policy / full, and flags one below 0.9; a few minutes at 2k on a 2-core "
                        "CPU), or passkey "
                        "(five depths of --eval-keys passkeys in --eval-family prompts)")
    add(p, "--samples", default=4, shown="4 per task (--check suite; --no-measure skips the check)")
    p.add_argument("--eval-family", default=None,
                   help="--check passkey: prompt family of the passkey check (default text: running text from the "
                        "evaluated part of --data, a family the default calibration never saw; numbers when there "
                        "is no text)")
    p.add_argument("--eval-length", type=int, default=None,
                   help="--check passkey: passkey prompt length (default: --context)")
    p.add_argument("--eval-keys", type=int, default=1,
                   help="--check passkey: passkeys per depth (5 depths); 0: skip")
    p.add_argument("--no-measure", action="store_true",
                   help="skip the measurements through generate(): KV bytes held, peak memory, decode speed and the "
                        "--check (suite or passkey) of the full cache and the policy")
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
                "model/, with --vllm, vllm/")
    add(p, "--save-model")
    p.add_argument("--vllm", action="store_true",
                   help="also write OUT/vllm, a folder vLLM serves with the policy: natively when whole layers stream "
                        "(Llama, Mistral), else with the headwise-vllm plugin (plugins/vllm); windows without sinks "
                        "(docs/serving.md)")
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
MEASURED = "the measured prompt ('text' family, its last 10%)"


def data_uses(args: argparse.Namespace, settings, gates) -> dict[str, bool]:
    """What a text is read for under these options → whether the user asked for it explicitly (a use asked for
    needs a text; the others are skipped, or take another prompt family, without one)."""
    from ..kvcache.choose import needs_text

    uses = {}
    if needs_text(settings.ranking) and args.data is not None:
        uses[f"calibration of 'outside' for --kv-ranking {settings.ranking} (its first 90%, beside Python's "
             "documentation and source)"] = False
    if any(name.startswith("text") for name in settings.calibration_families):
        uses["the 'text' calibration prompts (--calibration-families)"] = True
    if gates is not None and gates.haystack == "text":
        uses["the learned gates' haystack (--gate-haystack text)"] = True
    if not args.no_measure and (args.eval_family or "text").startswith("text"):
        uses[PASSKEY if args.check == "passkey" else MEASURED] = args.eval_family is not None
    if not args.no_measure and args.check == "suite" and args.data is not None:
        uses["the long-context check's second haystack (--check suite, beside prose)"] = True
    if not args.no_perplexity:
        uses[PERPLEXITY] = False
    return uses


def inputs_line(data: str | None, uses: dict[str, bool], ranking: str) -> str:
    """One line on what the text was used for (or that there was none, and what that changed)."""
    from ..kvcache.choose import ranking_scores

    if data is None:
        return "; ".join(["no text (--data) given and shared/data/wikitext-2/valid.txt not found: the ranking "
                          "calibrates on synthetic prompts" + (" and Python's documentation and source"
                                                               if "outside" in ranking_scores(ranking) else "")]
                         + (["perplexity skipped"] if PERPLEXITY in uses else [])
                         + (["the passkey check uses the 'numbers' family"] if PASSKEY in uses else [])
                         + (["the measured prompt uses the 'numbers' family"] if MEASURED in uses else []))
    if not uses:
        return (f"--data {data} is not used by these options (--kv-ranking {ranking} calibrates on synthetic prompts"
                + (" and Python's documentation and source)" if "outside" in ranking_scores(ranking) else ")"))
    return f"--data {data} is used only for {'; '.join(uses)} with --kv-ranking {ranking}"


def gate_config(args: argparse.Namespace, window: int):
    """The ``KVGateConfig`` of ``--scores learned`` (None otherwise); checked before the model loads."""
    from ..kvcache import KVGateConfig

    if args.scores != "learned":
        return None
    config = KVGateConfig(steps=args.gate_steps, lr=args.gate_lr, l1=args.gate_l1, length=args.gate_length,
                          sink=args.sink, window=window, region=args.gate_region, haystack=args.gate_haystack,
                          seed=args.seed)
    config.check()
    return config


def run(args: argparse.Namespace) -> int:
    from ..clients.vllm import export_vllm
    from ..io import atomic_dir, check_writable_dir, save_pretrained
    from ..kvcache import apply_kv_policy
    from ..kvcache.choose import default_window
    from ..report import Report
    from ..report.kv_policy import add_kv_policy_section
    from ..workflows.kv_policy import KVPolicySettings, PasskeyCheck, SuiteCheck, eval_text, kv_policy_experiment

    if args.task != "lm":
        raise HeadwiseError(f"--task {args.task}: kv-policy measures a decoder-only KV cache, on the lm task only")
    check_writable_dir(args.out, args.force)
    window = args.window or default_window(args.kv_budget, args.context, args.sink)
    gates = gate_config(args, window)
    settings = KVPolicySettings(
        kv_budget=args.kv_budget, context=args.context, sink=args.sink, window=window, fixed_window=args.fixed_window,
        ranking=args.ranking, gates=gates, calibration_length=args.calibration_length, seed=args.seed,
        calibration_families=tuple(args.calibration_families.split(",")), data_calibration=args.data is not None,
        eval_family=args.eval_family,
        measure=not args.no_measure, measure_new=args.measure_new, measure_repeats=args.measure_repeats,
        prefill_chunk=args.prefill_chunk, perplexity=not args.no_perplexity)
    given, data, uses = args.data, text_source(args), data_uses(args, settings, gates)  # given: the user's --data
    if data is None:
        needed = [use for use, asked in uses.items() if asked]
        if needed:
            raise HeadwiseError(f"{needed[0]} needs a text and none was given (shared/data/wikitext-2/valid.txt was "
                                "not found either): pass --data FILE (a UTF-8 text file)")
        settings.eval_family, settings.perplexity = settings.eval_family or "numbers", False
    task = lm_task(args, data)  # bad data fails before the model loads
    verify = SuiteCheck(args.context, args.samples, data=given) if args.check == "suite" else \
        PasskeyCheck(settings.eval_family or "text", args.eval_length or args.context, args.eval_keys, args.seed,
                     eval_text(task) if data is not None else None)
    model, tokenizer = load_for_task(args, task)
    print(f"headwise: {inputs_line(data, uses, settings.ranking)}", file=sys.stderr)  # once the inputs are known good
    found = kv_policy_experiment(model, tokenizer, task, settings, has_text=data is not None, verify=verify,
                                 out=str(Path(args.out)))
    policy, scores, check, ppl = found.policy, found.scores, found.summary[verify.name], found.summary["perplexity"]
    summary = {"verdict": found.summary["verdict"], "model": args.model, **found.summary,
               "inputs": {"data": data, "data_used_for": list(uses) if data is not None else [],
                          "calibration": found.calibrated_on,
                          "perplexity": None if ppl is None else f"the last 10% of {data}",
                          verify.name: None if not check else f"{check['family']} prompts" if args.check == "passkey"
                          else check["drawn_from"]},
               **run_record(task, None if ppl is None else ppl["full"][task.metric],
                            None if ppl is None else ppl["policy"][task.metric], None, model_costs(model), model)}
    with atomic_dir(args.out, overwrite=args.force) as tmp:
        if args.save_model or args.vllm:
            apply_kv_policy(model, policy)
        if args.save_model:
            save_pretrained(model, tmp / "model", tokenizer=tokenizer)
        served = export_vllm(model, tmp / "vllm", tokenizer=tokenizer) if args.vllm else None
        policy.save(tmp / "policy.json")
        write_json(tmp / "scores.json", scores.to_dict())
        write_json(tmp / "summary.json", summary, indent=1)
        report = Report("KV cache policy", f"{args.model}, budget {args.kv_budget} at {args.context} tokens")
        add_kv_policy_section(report, summary, scores.to_dict())
        report.write(tmp)
    if args.json:
        print_json(summary)
    else:
        for line in summary["verdict"].values():
            print(line)
        print(f"wrote {args.out}/policy.json, summary.json, scores.json, report.html")
    if served is not None:
        print(f"{args.out}/vllm: {served.describe()}", file=sys.stderr if args.json else sys.stdout)
    return 0
