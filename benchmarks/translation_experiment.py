"""Translation experiment for encoder-decoder heads (Voita et al. 2019; MHR), numbers in docs/encoder-decoder.md.

A small Marian model (3 + 3 layers, 8 heads per attention, d_model 128) is trained from scratch on a parallel
corpus: by default the synthetic language pair of ``headwise.tasks.corpus`` (built here, deterministic),
or ``--corpus DIR`` holding ``{train,dev,test}.{src,tgt}`` (e.g. IWSLT14 De-En; no code change). Phases, each
cached in ``<work>/results.json`` so a killed run resumes at the first unfinished phase:

- ``baseline``: train from scratch, greedy test BLEU; the checkpoint goes to ``<work>/baseline``;
- ``continue``: the control for every arm that trains further: the baseline trained ``--arm-steps`` more updates;
- ``l0-<f>``: Hard-Concrete gates on all three kinds, dual ascent towards keeping a fraction ``f`` of the heads
  (``--targets``), open heads per kind traced during training, then exactly that many heads kept and the rest
  removed physically (``keep_l0_heads``); BLEU of the smaller model;
- ``mask-l0`` / ``mask-random``: Voita's fixed ``alive_heads`` tables per kind: the survivors of the smallest
  L0 target, and random heads with the same count per layer; BLEU right after masking and after ``--arm-steps``;
- ``swap``: MHR swapping between decoder layers 0 and 2 (heads 0-3 of ``dec-self`` and of ``dec-enc``): BLEU right
  after the swap, and after ``--arm-steps`` of training swapped for the first half and swapped back for the second;
- ``mix``: alpha mixers on every site with the nuclear-norm term (grow), BLEU before and after ``fold_mixing``;
- ``roles``: Voita's head roles (positional, rare-token, alignment-like) on the baseline, shown for the survivors.

Run: ``flock /tmp/headwise-cpu.lock python benchmarks/translation_experiment.py --work /tmp/headwise-mt``
(about 35 min on one CPU thread); ``--phases baseline,l0`` runs a subset; ``--render`` only rewrites the doc.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast, TrainerCallback
from transformers.models.marian.modeling_marian import shift_tokens_right

import headwise
from common import machine, update_section
from headwise.analysis import head_roles
from headwise.tasks import (ParallelCorpus, SyntheticGrammar, build_synthetic_corpus, evaluate_bleu, read_corpus,
                                 train_tokenizer)
from headwise.tasks.corpus import token_alignment
from headwise.io import atomic_write_text
from headwise.mixing import (MixingConfig, NuclearNormPenalty, NuclearNormTraining, SwapSchedule, add_mixers,
                             alpha_table, fold_mixing, swap_heads, undo_swaps)
from headwise.pruning import L0Config, L0Penalty, L0Training, add_l0_gates, apply_masks, keep_l0_heads, l0_gates
from headwise.sites import find_sites
from headwise.training import train_translation

DOC = Path(__file__).resolve().parents[1] / "docs" / "encoder-decoder.md"
KINDS = ("enc-self", "dec-self", "dec-enc")
PHASES = ("baseline", "continue", "l0", "mask", "swap", "mix", "roles")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="/tmp/headwise-mt", help="cache directory (corpus, tokenizer, checkpoints)")
    p.add_argument("--corpus", help="directory with {train,dev,test}.{src,tgt}; default: build the synthetic pair")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--render", action="store_true", help="only rewrite docs/encoder-decoder.md from the cache")
    p.add_argument("--vocab", type=int, default=2000, help="joint BPE vocabulary (about 10000 for IWSLT14)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--baseline-steps", type=int, default=2000)
    p.add_argument("--l0-steps", type=int, default=400)
    p.add_argument("--arm-steps", type=int, default=200)
    p.add_argument("--targets", default="0.5,0.25", help="fractions of all heads kept by L0")
    p.add_argument("--gamma", type=float, default=0.1, help="weight of the nuclear-norm term (mix)")
    p.add_argument("--test", type=int, default=1000, help="test sentences scored (first N)")
    p.add_argument("--train", type=int, help="train pairs used (first N; default all)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class GateTrace(TrainerCallback):
    """Open L0 heads per kind (eval gate > 0) every ``every`` updates: which kind loses heads first."""

    def __init__(self, model: torch.nn.Module, every: int = 25) -> None:
        kinds = {s.path: s.kind for s in find_sites(model)}
        self.gates = [(kinds[p], g) for p, g in l0_gates(model).items()]
        self.every, self.rows = every, []

    @torch.no_grad()
    def record(self, step: int) -> None:
        row = {"step": step}
        for kind, gate in self.gates:
            row[kind] = row.get(kind, 0) + int((gate.eval_gates() > 0).sum())
        self.rows.append(row)

    def on_train_begin(self, args, state, control, **kwargs):
        self.record(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.record(state.global_step)


class Experiment:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.work = args, Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.cache = self.work / "results.json"
        self.results = json.loads(self.cache.read_text()) if self.cache.exists() else {}
        corpus = Path(args.corpus) if args.corpus else self.work / "corpus"
        if not args.corpus and not (corpus / "test.tgt").exists():
            build_synthetic_corpus(corpus, seed=args.seed)
        self.corpus_dir = corpus
        self.train_pairs = read_corpus(corpus, "train").head(args.train)
        self.dev = read_corpus(corpus, "dev").head(200)
        self.test = read_corpus(corpus, "test").head(args.test)
        self.tok = self._tokenizer()

    def _tokenizer(self) -> PreTrainedTokenizerFast:
        path = self.work / "tokenizer"
        if not path.exists():
            tok = train_tokenizer(self.train_pairs.source + self.train_pairs.target, self.args.vocab)
            tok.save_pretrained(path)
        return PreTrainedTokenizerFast.from_pretrained(path)

    def phase(self, name: str, fn: Callable[[], dict]) -> dict:
        if name not in self.results:
            print(f"== {name}", flush=True)
            start = time.perf_counter()
            out = fn()
            out["wall_s"] = round(time.perf_counter() - start, 1)
            self.results[name] = out
            atomic_write_text(self.cache, json.dumps(self.results, indent=1))
        return self.results[name]

    # ---- helpers ------------------------------------------------------------------------------------------
    def bleu(self, model: torch.nn.Module) -> float:
        return round(evaluate_bleu(model, self.tok, self.test, batch_size=100, max_new_tokens=128,
                                   progress=False).bleu, 2)

    def train(self, model: torch.nn.Module, steps: int, **kw):
        kw.setdefault("learning_rate", 3e-4)
        kw.setdefault("warmup_ratio", 0.0)
        return train_translation(model, self.tok, self.train_pairs, max_steps=steps, batch_size=self.args.batch,
                                 seed=self.args.seed, progress=False, logging_steps=100, **kw)

    def baseline_model(self) -> torch.nn.Module:
        model = MarianMTModel.from_pretrained(self.work / "baseline")
        return headwise.enable(model)

    def sites(self, model) -> dict[str, list]:
        by_kind: dict[str, list] = {}
        for s in find_sites(model):
            by_kind.setdefault(s.kind, []).append(s)
        return by_kind

    # ---- phases -------------------------------------------------------------------------------------------
    def baseline(self) -> dict:
        a = self.args
        config = MarianConfig(vocab_size=len(self.tok), d_model=a.d_model, encoder_layers=a.layers,
                              decoder_layers=a.layers, encoder_attention_heads=a.heads, decoder_attention_heads=a.heads,
                              encoder_ffn_dim=a.ffn, decoder_ffn_dim=a.ffn, max_position_embeddings=256,
                              scale_embedding=True, dropout=0.1, attention_dropout=0.0,
                              pad_token_id=self.tok.pad_token_id, eos_token_id=self.tok.eos_token_id,
                              decoder_start_token_id=self.tok.pad_token_id, forced_eos_token_id=self.tok.eos_token_id)
        torch.manual_seed(a.seed)
        model = MarianMTModel(config)
        trainer = train_translation(model, self.tok, self.train_pairs, dev=self.dev, max_steps=a.baseline_steps,
                                    batch_size=a.batch, learning_rate=2e-3, warmup_ratio=0.05,
                                    eval_steps=max(a.baseline_steps // 4, 1), seed=a.seed, progress=False,
                                    logging_steps=100)
        model.save_pretrained(self.work / "baseline")
        dev_bleu = [[r["step"], round(r["eval_bleu"], 2)] for r in trainer.state.log_history if "eval_bleu" in r]
        return {"bleu": self.bleu(model), "dev_bleu": dev_bleu, "steps": a.baseline_steps,
                "parameters": sum(p.numel() for p in model.parameters()),
                "train_pairs": len(self.train_pairs), "test_pairs": len(self.test)}

    def control(self) -> dict:
        model = self.baseline_model()
        self.train(model, self.args.arm_steps)
        return {"bleu": self.bleu(model)}

    def l0(self, fraction: float) -> dict:
        model = self.baseline_model()
        total = sum(s.num_heads for s in find_sites(model))
        keep = max(1, round(total * fraction))
        steps = self.args.l0_steps
        add_l0_gates(model, L0Config(init=3.0))
        training = L0Training(lam=0.0, target_heads=keep, lambda_lr=0.01, target_warmup=steps // 2)
        penalty, trace = L0Penalty(model, training), GateTrace(model, every=max(1, steps // 20))
        self.train(model, steps, penalties=[penalty], callbacks=[trace], head_learning_rate=0.1)
        gated_bleu = self.bleu(model)
        names = [s.name for s in find_sites(model)]
        heads = {s.name: s.num_heads for s in find_sites(model)}
        removed = keep_l0_heads(model, keep)
        survivors = {n: [h for h in range(heads[n]) if h not in removed.get(n, [])] for n in names}
        kept = {k: sum(len(v) for n, v in survivors.items() if n.startswith(k + ".")) for k in KINDS}
        return {"keep": keep, "total": total, "lambda": round(penalty.lam, 4), "trace": trace.rows,
                "open_per_kind": {k: trace.rows[-1][k] for k in KINDS}, "kept_per_kind": kept,
                "survivors": survivors, "bleu_gated": gated_bleu, "bleu": self.bleu(model),
                "parameters": sum(p.numel() for p in model.parameters())}

    def alive_table(self, model, survivors: dict[str, list[int]]) -> dict[str, list[list[int]]]:
        return {kind: [[int(h in survivors[s.name]) for h in range(s.num_heads)]
                       for s in sorted(sites, key=lambda s: s.layer)] for kind, sites in self.sites(model).items()}

    def mask(self, survivors: dict[str, list[int]]) -> dict:
        model = self.baseline_model()
        table = self.alive_table(model, survivors)
        apply_masks(model, table)
        before = self.bleu(model)
        self.train(model, self.args.arm_steps)
        return {"alive_heads": table, "bleu_masked": before, "bleu": self.bleu(model)}

    def random_survivors(self, like: dict[str, list[int]]) -> dict[str, list[int]]:
        rng = random.Random(self.args.seed)
        heads = {s.name: s.num_heads for s in find_sites(self.baseline_model())}
        return {n: sorted(rng.sample(range(heads[n]), len(v))) for n, v in like.items()}

    def swap(self) -> dict:
        last = self.args.layers - 1
        model = self.baseline_model()
        half = self.args.heads // 2
        swaps = {k: [f"{k}.0:{h} <-> {k}.{last}:{h}" for h in range(half)] for k in ("dec-self", "dec-enc")}
        immediate = {}
        for kind, kind_swaps in swaps.items():
            swap_heads(model, kind_swaps)
            immediate[kind] = self.bleu(model)
            undo_swaps(model, kind_swaps)
        both = swaps["dec-self"] + swaps["dec-enc"]
        schedule = SwapSchedule(model, {"0": both, str(self.args.arm_steps // 2): both[::-1]}, unit="step")
        self.train(model, self.args.arm_steps, callbacks=[schedule])
        return {"swaps": both, "bleu_swapped_untrained": immediate, "applied": len(schedule.applied),
                "bleu": self.bleu(model)}

    def mix(self) -> dict:
        model = self.baseline_model()
        add_mixers(model, MixingConfig())
        term = NuclearNormPenalty(model, NuclearNormTraining(gamma=self.args.gamma, direction="grow", radius=1e-2))
        self.train(model, self.args.arm_steps, penalties=[term], callbacks=[term], head_learning_rate=1e-2)
        norms: dict[str, list[float]] = {}
        for name, entry in alpha_table(model).items():
            norms.setdefault(entry["kind"], []).append(round(entry["nuclear_norm"], 3))
        unfolded = self.bleu(model)
        fold_mixing(model)
        return {"nuclear_norms": norms, "bleu_unfolded": unfolded, "bleu": self.bleu(model)}

    def roles(self) -> dict:
        """Voita's roles on the baseline over 300 test pairs; rare = rarest in the training data; alignment from
        the grammar's word alignments (synthetic corpus) or the diagonal proxy (a user corpus)."""
        model = self.baseline_model()
        pairs = self.test.head(300)
        links = None
        if not self.args.corpus:
            grammar = SyntheticGrammar(seed=self.args.seed)
            sentences = grammar.sentences("test", len(pairs))
            if [grammar.source(x) for x in sentences] != pairs.source:
                raise SystemExit(f"{self.corpus_dir} was not built with seed {self.args.seed}; rebuild it")
            links = [grammar.alignment(x) for x in sentences]
        counts = torch.zeros(len(self.tok), dtype=torch.float64)
        for ids in self.tok(self.train_pairs.source + self.train_pairs.target)["input_ids"]:
            counts += torch.bincount(torch.tensor(ids), minlength=len(self.tok)).double()
        batches = []
        for start in range(0, len(pairs), 50):
            chunk = ParallelCorpus(pairs.source[start:start + 50], pairs.target[start:start + 50])
            enc = self.tok(chunk.source, text_target=chunk.target, padding=True, return_tensors="pt")
            batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                     "decoder_input_ids": shift_tokens_right(enc["labels"], self.tok.pad_token_id,
                                                             model.config.decoder_start_token_id),
                     "decoder_attention_mask": (enc["labels"] != self.tok.pad_token_id).long()}
            if links is not None:
                batch["alignment"] = token_alignment(self.tok, chunk, links[start:start + 50])
            batches.append(batch)
        found = head_roles(model, batches, counts=counts)
        roles = {site["name"]: [", ".join(r) or "-" for r in row] for site, row in zip(found.sites, found.roles)}
        return {"roles": roles, "by_kind": found.by_kind(), "alignment_source": found.alignment_source,
                "scores": {k: {site["name"]: v for site, v in zip(found.sites, values)}
                           for k, values in found.scores.items()}}

    def run(self) -> None:
        wanted = set(self.args.phases.split(","))
        unknown = wanted - set(PHASES)
        if unknown:
            raise SystemExit(f"unknown phase {sorted(unknown)[0]!r}; phases: {', '.join(PHASES)}")
        self.phase("baseline", self.baseline)
        if "continue" in wanted:
            self.phase("continue", self.control)
        fractions = [float(f) for f in self.args.targets.split(",")]
        if "l0" in wanted:
            for f in fractions:
                self.phase(f"l0-{f:g}", lambda f=f: self.l0(f))
        if "mask" in wanted:
            survivors = self.results[f"l0-{min(fractions):g}"]["survivors"]
            self.phase("mask-l0", lambda: self.mask(survivors))
            self.phase("mask-random", lambda: self.mask(self.random_survivors(survivors)))
        if "swap" in wanted:
            self.phase("swap", self.swap)
        if "mix" in wanted:
            self.phase("mix", self.mix)
        if "roles" in wanted:
            self.phase("roles", self.roles)


def render(results: dict, args: argparse.Namespace) -> str:
    """The markdown section of docs/encoder-decoder.md from the cached results."""
    base = results["baseline"]
    lines = [f"Measured on {machine()} (a machine shared with other jobs: times are indicative). "
             f"Model: Marian, {args.layers}+{args.layers} layers, {args.heads} heads, d_model {args.d_model}, "
             f"FFN {args.ffn}, {base['parameters']:,} parameters; {base['train_pairs']:,} training pairs, batch "
             f"{args.batch}; greedy BLEU (sacrebleu) on the first {base['test_pairs']} test pairs.", "",
             "| arm | what | test BLEU |", "|---|---|---:|",
             f"| baseline | {base['steps']} updates from scratch ({base['wall_s'] / 60:.0f} min) | "
             f"{base['bleu']:.2f} |"]
    if "continue" in results:
        lines.append(f"| continue | baseline + {args.arm_steps} updates (control for the arms below) | "
                     f"{results['continue']['bleu']:.2f} |")
    l0 = {k: v for k, v in results.items() if k.startswith("l0-")}
    for name, r in l0.items():
        lines.append(f"| {name} | L0 gates, {args.l0_steps} updates, keep {r['keep']}/{r['total']} heads; gated | "
                     f"{r['bleu_gated']:.2f} |")
        lines.append(f"| {name} pruned | heads removed physically ({r['parameters']:,} parameters) | {r['bleu']:.2f} |")
    for name in ("mask-l0", "mask-random"):
        if name in results:
            r = results[name]
            lines.append(f"| {name} | fixed alive_heads, no training | {r['bleu_masked']:.2f} |")
            lines.append(f"| {name} | fixed alive_heads + {args.arm_steps} updates | {r['bleu']:.2f} |")
    if "swap" in results:
        r = results["swap"]
        for kind, b in r["bleu_swapped_untrained"].items():
            lines.append(f"| swap {kind} | heads 0-{args.heads // 2 - 1} of {kind}.0 ↔ {kind}.{args.layers - 1}, "
                         f"no training | {b:.2f} |")
        lines.append(f"| swap | both swaps for {args.arm_steps // 2} updates, swapped back for "
                     f"{args.arm_steps - args.arm_steps // 2} | {r['bleu']:.2f} |")
    if "mix" in results:
        r = results["mix"]
        norms = ", ".join(f"{k} {sum(v) / len(v):.2f}" for k, v in r["nuclear_norms"].items())
        lines.append(f"| mix | alpha mixers + nuclear-norm term (γ={args.gamma}), {args.arm_steps} updates; "
                     f"mean ‖α‖_* {norms} (identity: {args.heads}) | {r['bleu_unfolded']:.2f} |")
        lines.append(f"| mix folded | after fold_mixing | {r['bleu']:.2f} |")
    if l0:
        lines += ["", "Heads kept per kind (of " + ", ".join(
            f"{len([n for n in next(iter(l0.values()))['survivors'] if n.startswith(k + '.')]) * args.heads} {k}"
            for k in KINDS) + "):", "",
                  "| run | target | " + " | ".join(f"{k} open after L0" for k in KINDS) + " | "
                  + " | ".join(f"{k} kept" for k in KINDS) + " | final λ |",
                  "|---|---:|" + "---:|" * 6 + "---:|"]
        for name, r in l0.items():
            lines.append(f"| {name} | {r['keep']} | " + " | ".join(str(r["open_per_kind"][k]) for k in KINDS) + " | "
                         + " | ".join(str(r["kept_per_kind"][k]) for k in KINDS) + f" | {r['lambda']} |")
        lines += ["", "Open heads per kind during L0 training (which kind loses heads first):", ""]
        for name, r in l0.items():
            rows = r["trace"]
            marks = sorted({rows[int(i * (len(rows) - 1) / 4)]["step"] for i in range(5)})
            lines.append(f"| {name}, step | " + " | ".join(str(m) for m in marks) + " |")
            lines.append("|---|" + "---:|" * len(marks))
            for k in KINDS:
                lines.append(f"| {k} | " + " | ".join(str(row[k]) for row in rows if row["step"] in marks) + " |")
            lines.append("")
        roles = results.get("roles", {}).get("roles")
        if roles is None:
            lines += ["TODO: head roles (run the `roles` phase).", ""]
        else:
            role_names = sorted({r.strip() for row in roles.values() for h in row for r in h.split(",") if r != "-"})
            lines += [f"Head roles on the baseline (Voita's definitions, `headwise.analysis.head_roles`; alignment "
                      f"from {results['roles']['alignment_source']}) and how many of those heads L0 kept:", "",
                      "| kind | role | baseline heads | " + " | ".join(f"kept by {n}" for n in l0) + " |",
                      "|---|---|---:|" + "---:|" * len(l0)]
            for kind in KINDS:
                for role in role_names + ["-"]:
                    heads = [(site, h) for site, row in roles.items() if site.startswith(kind + ".")
                             for h, r in enumerate(row) if role in [x.strip() for x in r.split(",")]]
                    if heads:
                        kept = [sum(h in r["survivors"][site] for site, h in heads) for r in l0.values()]
                        lines.append(f"| {kind} | {'none' if role == '-' else role} | {len(heads)} | "
                                     + " | ".join(str(k) for k in kept) + " |")
            best = []
            for kind in KINDS:
                scores = {name: [v for site, row in results["roles"]["scores"][name].items()
                                 if site.startswith(kind + ".") for v in row if v is not None]
                          for name in ("prev", "next", "rare", "alignment")}
                best.append(f"{kind} " + ", ".join(f"{n} {max(v):.2f}" for n, v in scores.items() if v))
            lines += ["", "Largest role score per kind (share of query rows; thresholds: positional 0.9, rare 0.5, "
                      "alignment 0.5): " + "; ".join(best) + ".", ""]
        lines += ["Survivors per layer (head index, its roles on the baseline in brackets):", "",
                  "| run | kind | survivors |", "|---|---|---|"]
        for name, r in l0.items():
            for kind in KINDS:
                layers = [(site, heads) for site, heads in r["survivors"].items() if site.startswith(kind + ".")]
                text = "; ".join(f"L{site.split('.')[-1]}: " + ", ".join(
                    f"{h}" + (f" [{roles[site][h]}]" if roles and roles[site][h] != "-" else "") for h in heads)
                    for site, heads in layers)
                lines.append(f"| {name} | {kind} | {text} |")
    return "\n".join(lines)


def main() -> None:
    torch.set_num_threads(1)
    args = parse_args()
    if not args.render:
        Experiment(args).run()
    results = json.loads((Path(args.work) / "results.json").read_text())
    update_section("translation", render(results, args), doc=DOC)
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
