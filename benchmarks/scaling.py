"""How each verb's cost grows with model size and context (issue 32): time and peak process memory per verb on
SmolLM2-135M and on random-initialised models with the shapes of SmolLM2-360M, Llama-3.2-1B and Llama-3-8B
(the 8B shape layer-sliced: 2 of its 32 decoder layers, a lower bound to extrapolate per layer).

Every (shape, verb, context) arm runs in a fresh process, so its peak memory is its own. Memory is reported as
``(peak anonymous RSS − anonymous RSS before the model exists, libraries imported) / weights' bytes`` — the
verb's memory in units of the model, sampled every 5 ms while the verb runs (loading's own transient peak is
recorded apart, ``anon_load_peak_mb``) — and the raw peak RSS (which also counts the page cache of the
memory-mapped checkpoint and the pages of the libraries' code). Verbs (the Python calls the CLI verbs make):

- ``eval``: ``lm`` perplexity over ``2 × context`` tokens of WikiText-2 in windows of ``context``;
- ``analyze``: statistics by blocks of query rows + gradient importance of the text's own next-token loss
  (``analyze --task lm``, one text of ``context`` tokens), the default ``recompute=None``: activations kept for the
  backward when they fit the margin (0.2x the weights), else recomputed as ``recompute_plan`` fits them (blocks;
  decoder layers one at a time, their inputs on disk; segments of blocks, MLP chunks); rows at 512, 2k and 8k
  tokens (SmolLM2's context is 8,192);
- ``analyze-recompute``: the same with ``recompute=True`` (``--activations recompute``: always recomputed);
- ``analyze-stats``: the statistics alone (``--importance none``: no gradient pass);
- ``kv-policy``: ``kv_policy`` (retrieval ranking, budget 0.5 at ``context``);
- ``prune``: gradient importance of the lm loss (2 windows) then removal of a quarter of the KV groups;
- ``plan``: ``headwise.plan`` with ``--methods prune_heads,gqa`` (budget heads=0.8, 8 importance windows, 8
  calibration windows); the same process first runs the task's ``evaluate``, and the plan's bound is the loaded model
  + that evaluate's peak above it + ``PLAN_MARGIN`` (0.25x the weights);
- ``apply``: a planned removal applied to the model (``Plan.execute`` path: ``apply_edit``), then ``eval``;
- ``recover``: a quarter of the heads masked (a reversible edit), then ``recover(..., teacher="off")``: distillation
  from the model itself with its masks switched off, 2 optimizer steps of 1 window. Its bound is 1.3 plus AdamW's
  state of what is trained (two moments: 2 × the trainable bytes, ``optimizer_mb``) over the weights;
- ``recover-bounded``: the same with ``memory="bounded"`` (blocks recomputed in the backward, each parameter
  updated in the backward: no gradients held together).

Quality numbers mean nothing on random weights; time and memory are real. Under load only ratios measured in
one run mean anything; the lead re-runs the full table on an idle machine.

On a GPU (``--device cuda``, e.g. ``--dtype bfloat16``) the model is built on the device and memory is the
device's: ``torch.cuda.max_memory_allocated`` over the verb (the weights included; nothing else is on the device
before the model) divided by the weights' bytes, the way the CPU ratio reads. There the 8B shape runs whole
(``llama-3-8b``, 32 layers). ``SCALING_DATA`` / ``SCALING_TOKENIZER`` point at WikiText-2's ``valid.txt`` and a
tokenizer folder where ``shared/`` or the packaged SmolLM2 is not there (a random-weights shape needs only the
tokenizer).

Run: ``python benchmarks/scaling.py [--quick] [--shapes smollm2-135m,smollm2-360m,llama-3.2-1b]
[--contexts 512,2048] [--verbs eval,analyze,...] [--device cuda --dtype bfloat16] [--note "how it was measured"]``.
Writes benchmarks/results/scaling_cpu.json and benchmarks/results/scaling_cpu.md (``--out``); the Markdown names
the rows above their bound.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("SCALING_DATA", "/work/shared/data/wikitext-2/valid.txt"))
VERBS = ("eval", "analyze", "analyze-recompute", "analyze-stats", "kv-policy", "prune", "plan", "apply", "recover",
         "recover-bounded")
BOUNDS = {"eval": 1.3, "analyze": 1.3, "analyze-recompute": 1.3, "analyze-stats": 1.3, "kv-policy": 1.3, "prune": 2.0,
          "plan": 2.0, "apply": 2.0, "recover": 1.3, "recover-bounded": 1.3}
PLAN_MARGIN = 0.25  # what a plan may hold beyond its task's evaluate, in units of the weights (issue 50)
SHAPES = {  # transformers LlamaConfig fields of each shape (SmolLM2 is a Llama)
    "smollm2-135m": None,  # the packaged model itself
    "smollm2-360m": dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                         intermediate_size=2560, vocab_size=49152, tie_word_embeddings=True),
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, head_dim=64),
    "llama-3-8b/2-layers": dict(hidden_size=4096, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                                intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
    "llama-3-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0),
}
RECOVER_ARGS = json.loads(os.environ.get("SCALING_RECOVER_ARGS", "{}"))  # e.g. {"optim": "adamw_torch_fused"}
QUICK = dict(shapes=["smollm2-135m"], contexts=[256], verbs=list(VERBS))


def anon_mb() -> float:
    """Anonymous resident memory (MiB) of this process: tensors and Python objects, not the page cache of
    memory-mapped checkpoint files (which the kernel can drop)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


def peak_mb() -> float:
    """Peak resident memory (MiB) of this process, mapped files included."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class AnonPeak:
    """Samples ``anon_mb`` every 5 ms in a thread; ``peak`` is the largest value seen."""

    def __init__(self) -> None:
        import threading

        self.peak, self._stop = anon_mb(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, anon_mb())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anon_mb())
        return self.peak


def fingerprint(model) -> str:
    """SHA-1 over the state dict's names, shapes, dtypes and bytes (the plan must leave it bit-identical)."""
    import hashlib

    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def build(shape: str, context: int, device: str = "cpu", dtype: str = "float32"):
    """``(model, tokenizer)``: SmolLM2-135M, or a random-initialised Llama of ``shape`` with SmolLM2's tokenizer
    (``SCALING_TOKENIZER``: a folder holding it), built on ``device`` in ``dtype``."""
    import torch
    import transformers as tf

    import headwise

    torch_dtype = getattr(torch, dtype)
    if SHAPES[shape] is None:
        model, tokenizer = headwise.load_model("smollm2-135m", task="lm", device=device, dtype=torch_dtype)
        with torch.no_grad():  # from the checkpoint's memory map into process memory, as a loaded model holds it
            for p in model.parameters():
                p.data = p.data.clone()
        return model, tokenizer
    from headwise.models import resolve_model

    folder = os.environ.get("SCALING_TOKENIZER") or resolve_model("smollm2-135m")
    tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    config = tf.LlamaConfig(**SHAPES[shape], max_position_embeddings=max(8192, context), rms_norm_eps=1e-5)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise", dtype=torch_dtype)
    return model.eval(), tokenizer


def child(shape: str, verb: str, context: int, text: str, device: str = "cpu", dtype: str = "float32") -> dict:
    """Run one arm in this (fresh) process; returns its measurements."""
    if device != "cpu":
        return child_on_device(shape, verb, context, text, device, dtype)
    import torch
    import transformers  # noqa: F401  (libraries loaded before the baseline)
    from transformers.models.llama import modeling_llama  # noqa: F401

    import headwise  # noqa: F401
    from headwise import analysis, kvcache, planning, tasks  # noqa: F401
    from headwise.allocator import ENV, return_freed_memory

    threshold = int(os.environ.get(ENV, "0")) if return_freed_memory() else 0  # as the CLI does

    before = anon_mb()
    sampler = AnonPeak()
    model, tokenizer = build(shape, context, device, dtype)
    tokenizer.model_max_length = max(context, 8192)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    load_peak, loaded = sampler.stop(), anon_mb()
    digest = fingerprint(model) if verb == "plan" else None
    optimizer = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    extra = {}
    if verb == "plan":  # its bound: the task's evaluate peak above the loaded model + 0.25x the weights
        sampler = AnonPeak()
        run_verb("eval", model, tokenizer, context, text)
        extra["eval_above_loaded"] = (sampler.stop() - loaded) * 2**20 / weights
    sampler = AnonPeak()
    start = time.perf_counter()
    run_verb(verb, model, tokenizer, context, text)
    seconds = time.perf_counter() - start
    peak = sampler.stop()
    if digest is not None:
        extra["model_unchanged"] = fingerprint(model) == digest
    if verb.startswith("recover"):
        extra["optimizer_mb"] = optimizer / 2**20
    return {**extra, "mmap_threshold": threshold, "shape": shape, "verb": verb, "context": context, "seconds": seconds, "weights_mb": weights / 2**20,
            "anon_before_mb": before, "anon_loaded_mb": loaded, "anon_load_peak_mb": load_peak,
            "anon_peak_mb": peak, "peak_rss_mb": peak_mb(), "ratio": (peak - before) * 2**20 / weights,
            "loaded_ratio": (loaded - before) * 2**20 / weights, "threads": torch.get_num_threads(),
            "heads": sum(s.num_heads for s in __import__("headwise").find_sites(model)),
            "layers": model.config.num_hidden_layers}


def child_on_device(shape: str, verb: str, context: int, text: str, device: str, dtype: str) -> dict:
    """``child`` on a GPU: peak memory is ``torch.cuda.max_memory_allocated`` over the verb (weights included)."""
    import torch

    import headwise  # noqa: F401

    model, tokenizer = build(shape, context, device, dtype)
    tokenizer.model_max_length = max(context, 8192)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    loaded = torch.cuda.memory_allocated()
    digest = fingerprint(model) if verb == "plan" else None
    optimizer = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run_verb(verb, model, tokenizer, context, text)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated()
    extra = {} if digest is None else {"model_unchanged": fingerprint(model) == digest}
    if verb.startswith("recover"):
        extra["optimizer_mb"] = optimizer / 2**20
    return {**extra, "device": torch.cuda.get_device_name(), "dtype": dtype, "shape": shape, "verb": verb,
            "context": context, "seconds": seconds, "weights_mb": weights / 2**20, "anon_before_mb": 0.0,
            "anon_loaded_mb": loaded / 2**20, "anon_load_peak_mb": loaded / 2**20, "anon_peak_mb": peak / 2**20,
            "reserved_peak_mb": torch.cuda.max_memory_reserved() / 2**20, "peak_rss_mb": peak_mb(),
            "ratio": peak / weights, "loaded_ratio": loaded / weights,
            "heads": sum(s.num_heads for s in headwise.find_sites(model)), "layers": model.config.num_hidden_layers}


def run_verb(verb: str, model, tokenizer, context: int, text: str) -> None:
    import headwise
    from headwise.analysis import analyze
    from headwise.tasks import LanguageModeling

    task = LanguageModeling(data=text, max_length=context, max_tokens=2 * context)
    if verb == "eval":
        task.evaluate(model, tokenizer, progress=False)
    elif verb in ("analyze", "analyze-recompute", "analyze-stats"):
        texts = [" ".join(Path(text).read_text().split()[: context])]
        analyze(model, tokenizer, texts, importance=() if verb == "analyze-stats" else ("gradient",), examples=0,
                batch_size=1, max_length=context, loss_fn=task.loss,
                recompute=True if verb == "analyze-recompute" else None, progress=False)
    elif verb == "kv-policy":
        from headwise.kvcache import ScoreConfig, kv_policy

        kv_policy(model, tokenizer, 0.5, context, 4, None, "retrieval",
                  config=ScoreConfig(length=min(512, context), sink=4, window=max(8, context // 4)), progress=False)
    elif verb == "prune":
        from headwise.planning.proxies import head_scores, removal_order
        from headwise.pruning.method import removal

        scores = head_scores(model, tokenizer, task, "gradient", examples=2)
        order = removal_order(model, scores)
        total = sum(s.num_heads for s in headwise.find_sites(model))
        headwise.prune_heads(model, removal(order, total // 4))
    elif verb == "plan":
        headwise.plan(model, tokenizer, task, "heads=0.8", examples=8, calibration=8, repeats=1, top_k=1,
                      methods=("prune_heads", "gqa"), progress=False)
    elif verb == "apply":
        from headwise.planning.edits import Edit, apply_edit
        from headwise.pruning.method import PruneHeadsConfig

        sites = headwise.find_sites(model)
        g = sites[0].group_size
        apply_edit(model, Edit((PruneHeadsConfig({s.name: list(range(g)) for s in sites}),)))  # one KV group a layer
        task.evaluate(model, tokenizer, progress=False)
    elif verb in ("recover", "recover-bounded"):
        import tempfile

        sites = headwise.find_sites(model)
        headwise.apply_masks(model, {s.name: [float(h >= s.num_heads // 4) for h in range(s.num_heads)] for s in sites})
        with tempfile.TemporaryDirectory() as out:
            headwise.recover(model, tokenizer, task, teacher="off", max_steps=2, batch_size=1, progress=False,
                             output_dir=out, memory="bounded" if verb == "recover-bounded" else "keep", **RECOVER_ARGS)
    else:
        raise SystemExit(f"unknown verb {verb}")


def _threshold(row: dict) -> str:
    """The row's glibc mmap threshold (rows measured before ``headwise.allocator``: glibc's dynamic default), or
    the GPU and dtype of a device row (its memory is the device allocator's)."""
    if "device" in row:
        return f"{row['device']}, {row['dtype']}"
    value = row.get("mmap_threshold", 0)
    return f"{value >> 10} KiB" if value else "glibc default"


def table(rows: list[dict]) -> str:
    lines = ["| shape | layers | heads | context | verb | time (s) | weights (MiB) | loaded / weights | "
             "peak anon (MiB) | (peak − before) / weights | bound | mmap threshold (or device) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | | | {r['context']} | {r['verb']} | error: {r['error'][:80]} | | | | | |")
            continue
        mark = "ok" if r["ratio"] <= bound(r) else "**over**"
        lines.append(f"| {r['shape']} | {r['layers']} | {r['heads']} | {r['context']} | {r['verb']} | "
                     f"{r['seconds']:.1f} | {r['weights_mb']:.0f} | {r['loaded_ratio']:.2f} | {r['anon_peak_mb']:.0f} | "
                     f"{r['ratio']:.2f} | "
                     f"≤ {bound(r):.2f} {mark} | {_threshold(r)} |")
    return "\n".join(lines)


def over(rows: list[dict]) -> str:
    """The sentence naming every row above its bound (or saying none is)."""
    bad = [f"{r['shape']} {r['verb']} at {r['context']} ({r['ratio']:.2f} > {bound(r):.2f})" for r in rows
           if "error" not in r and r["ratio"] > bound(r)]
    return ("Over their bound: " + "; ".join(bad) + ".") if bad else "Every row is within its bound."


def bound(row: dict) -> float:
    """A row's bound: its verb's, plus AdamW's moments over the weights for a recovery; a plan measured with its
    task's evaluate: the loaded model + that evaluate's peak above it + ``PLAN_MARGIN`` (issue 50)."""
    if row["verb"] == "plan" and "eval_above_loaded" in row:
        return row["loaded_ratio"] + row["eval_above_loaded"] + PLAN_MARGIN
    return BOUNDS[row["verb"]] + row.get("optimizer_mb", 0) / row["weights_mb"]


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares exponent ``a`` of ``y ∝ x^a`` over positive ``(x, y)`` points; None with fewer than 2 x's."""
    points = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in points}) < 2:
        return None
    mx, my = sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def growth(rows: list[dict]) -> str:
    """Fitted exponents per verb: time and memory above the loaded model against context (per shape) and time
    against the weights' bytes (per context). 1 = linear, 2 = quadratic."""
    ok = [r for r in rows if "error" not in r]
    fmt = lambda a: "–" if a is None else f"{a:.2f}"  # noqa: E731
    lines = ["| verb | time ∝ context^a (per shape) | memory above the model ∝ context^b (per shape) | "
             "time ∝ weights^c (per context) |", "|---|---|---|---|"]
    for verb in dict.fromkeys(r["verb"] for r in ok):
        mine = [r for r in ok if r["verb"] == verb]
        shapes, contexts = dict.fromkeys(r["shape"] for r in mine), dict.fromkeys(r["context"] for r in mine)
        by_context = [(sh, [r for r in mine if r["shape"] == sh]) for sh in shapes]
        a = ", ".join(f"{sh} {fmt(slope([(r['context'], r['seconds']) for r in rs]))}" for sh, rs in by_context)
        b = ", ".join(f"{sh} {fmt(slope([(r['context'], r['anon_peak_mb'] - r['anon_loaded_mb']) for r in rs]))}"
                      for sh, rs in by_context)
        c = ", ".join(f"{cx}: {fmt(slope([(r['weights_mb'], r['seconds']) for r in mine if r['context'] == cx]))}"
                      for cx in contexts)
        lines.append(f"| {verb} | {a} | {b} | {c} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="SmolLM2-135M at 256 tokens, every verb")
    parser.add_argument("--shapes", default="smollm2-135m,smollm2-360m,llama-3.2-1b,llama-3-8b/2-layers")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--verbs", default=",".join(VERBS))
    parser.add_argument("--threads", type=int, default=None, help="torch threads per arm (default: torch's)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per arm")
    parser.add_argument("--out", default=str(HERE / "results" / "scaling_cpu"))
    parser.add_argument("--merge", action="store_true", help="keep the rows of --out's JSON this run does not redo")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (memory: the device's allocator)")
    parser.add_argument("--dtype", default="float32", help="the weights' dtype (float32, bfloat16, float16)")
    parser.add_argument("--note", default="under load unless re-run on an idle machine",
                        help="how the run was measured (written above the table)")
    parser.add_argument("--child", nargs=3, metavar=("SHAPE", "VERB", "CONTEXT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        shape, verb, context = args.child
        print("RESULT " + json.dumps(child(shape, verb, int(context), str(DATA), args.device, args.dtype)), flush=True)
        return
    shapes, contexts, verbs = args.shapes.split(","), [int(c) for c in args.contexts.split(",")], args.verbs.split(",")
    if args.quick:
        shapes, contexts, verbs = QUICK["shapes"], QUICK["contexts"], QUICK["verbs"]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    out = Path(args.out)
    earlier = json.loads(out.with_suffix(".json").read_text())["rows"] if args.merge and \
        out.with_suffix(".json").exists() else []  # kept unless this run measures them again
    rows = []
    for shape in shapes:
        for context in contexts:
            for verb in verbs:
                cmd = [sys.executable, __file__, "--child", shape, verb, str(context), "--device", args.device,
                       "--dtype", args.dtype]
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
                    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                    row = json.loads(found[-1][7:]) if found else {
                        "shape": shape, "verb": verb, "context": context,
                        "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
                    if not found:
                        print("\n".join(done.stderr.strip().splitlines()[-12:]), flush=True)
                except subprocess.TimeoutExpired:
                    row = {"shape": shape, "verb": verb, "context": context, "error": f"over {args.timeout}s"}
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
                write(Path(args.out), rows, args, earlier)  # after every arm: a killed run keeps what it measured


def write(out: Path, rows: list[dict], args: argparse.Namespace, earlier: list[dict]) -> None:
    """``out``.json and .md: ``earlier``'s rows this run has not measured again, then ``rows``."""
    from headwise.io import atomic_write_text

    key = lambda r: (r["shape"], r["verb"], r["context"])  # noqa: E731
    fresh = {key(r) for r in rows}
    rows = [r for r in earlier if key(r) not in fresh] + rows
    meta = {"quick": args.quick, "python": sys.version.split()[0], "machine": os.uname().machine,
            "cpus": os.cpu_count(), "device": args.device, "dtype": args.dtype,
            "note": args.note}
    title = ("# Scaling (CPU)\n\n" if args.device == "cpu" else
             f"# Scaling ({args.device}, {args.dtype})\n\nMemory columns are the device allocator's: peak "
             "`torch.cuda.max_memory_allocated` during the verb, the weights included; the last column names the GPU."
             "\n\n") + f"Measured: {args.note}. {over(rows)}\n\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows}, indent=1))
    atomic_write_text(out.with_suffix(".md"), title + table(rows) + "\n\n## Fitted growth\n\n"
                      + growth(rows) + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", flush=True)


if __name__ == "__main__":
    main()
