"""A flag means one thing in every verb. This test reads every verb's parser: a flag that two verbs (or a verb and
``headwise edit``) share must be in the vocabulary below with its one meaning, so that reusing a flag for something
else is a decision a reviewer sees. Under ``headwise edit METHOD`` the options after the shared ones are the fields
of the method's config (``--bits`` is ``QuantizationConfig.bits``), which the contract keeps to one meaning each."""

from __future__ import annotations

import argparse
from collections import defaultdict

from headwise.cli import build_parser

VOCABULARY: dict[str, str] = {
    # model and output
    "--model": "the model: a named model, a hub name or a local folder",
    "--device": "torch device", "--dtype": "parameter dtype", "--device-map": "Accelerate dispatch of the model",
    "--max-memory": "per-device memory for dispatch", "--offload-folder": "disk offload folder for dispatch",
    "--verify": "hash every file of a folder headwise wrote before loading it",
    "--out": "the output folder", "--save-model": "also write OUT/model, the edited model", "--force": "replace a non-empty output folder", "--json": "print JSON",
    "--debug": "tracebacks", "--help": "help", "--no-eval": "skip the task evaluations",
    # task and data
    "--task": "which task's head, data and metric", "--data": "the task's data file or folder",
    "--data-dir": "translation corpus folder", "--split": "evaluated split", "--src": "source language suffix",
    "--tgt": "target language suffix", "--src-file": "source file", "--tgt-file": "target file",
    "--text-column": "classification text column", "--pair-column": "classification second text column",
    "--label-column": "classification label column", "--new-head": "a fresh classification head",
    "--limit": "use only the first N examples of the evaluated (or analysed) data",
    "--max-length": "tokens per sequence (lm: per window)", "--stride": "lm window stride",
    "--max-tokens": "lm: evaluate only the first N tokens", "--batch-size": "examples per forward pass",
    "--beam": "beam width of translation", "--max-new-tokens": "generated tokens per translation",
    "--text": "a text file for calibration and evaluation of a conversion",
    "--calibration-limit": "calibration examples used",
    "--calib-tokens": "calibration tokens of a conversion", "--eval-tokens": "evaluation tokens of a conversion",
    "--importance-examples": "training examples for gradient importance",
    # recovery (one option group: prune, compress, replace, plan, apply)
    "--recover": "recovery after the edit: distill, finetune or none", "--recover-epochs": "epochs of recovery",
    "--recover-steps": "recovery steps", "--finetune": "shorthand for --recover finetune --recover-epochs E",
    "--teacher": "where distillation's teacher comes from", "--temperature": "distillation: softening of logits "
    "(under headwise edit l0: L0Config.temperature)", "--alpha": "distillation: weight of the teacher term",
    "--distance": "distillation: distance of outputs", "--distill": "distillation shorthand",
    "--train-memory": "recovery training's memory: keep, bounded or auto (trainer.memory)",
    # methods (the same config field as under headwise edit METHOD)
    "--kinds": "attention kinds selected", "--dk": "collaborative width", "--init": "the method's initialisation",
    "--iterations": "ALS sweeps", "--kv-heads": "key/value heads after GQA conversion",
    "--kv-budget": "share of the full KV cache's bytes",
    "--prefill-chunk": "tokens per prefill forward of generate()", "--rank": "latent width", "--rope-pairs": "rotary pairs "
    "outside the latent", "--grouping": "GQA grouping", "--allow-empty-layers": "allow removing every head of a layer",
    "--method": "prune: how heads are chosen (under headwise edit quantization: QuantizationConfig.method)",
    "--methods": "the methods to run or combine", "--bits": "quantizer bit widths", "--threshold": "pruning "
    "threshold of attention probabilities", "--floor": "quantizer floor", "--renormalize": "renormalise pruned rows",
    "--top-edge": "quantizer top edge", "--scope": "quantizer population", "--zeros": "quantizer zeros",
    "--bin-value": "quantizer bin value", "--gamma": "nuclear-norm coefficient", "--ranking": "how heads are ranked",
    # training
    "--epochs": "epochs of the verb's own training (L0 in prune, the model in train translation)",
    "--max-steps": "updates of the verb's own training", "--lr": "learning rate of the verb's own training",
    "--seed": "random seed", "--resume": "continue unfinished training in the output",
    "--uptrain-tokens": "uptraining tokens of a conversion", "--keep-checkpoints": "keep training checkpoints",
}


def verb_flags() -> dict[str, set[str]]:
    """``{flag: {verb, ...}}`` over every verb; the method fields under ``edit METHOD`` count as the verb ``edit``."""
    flags: dict[str, set[str]] = defaultdict(set)

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, path + [name])
            for flag in action.option_strings:
                if flag.startswith("--"):
                    flags[flag].add("edit" if path[:1] == ["edit"] else " ".join(path))

    walk(build_parser(), [])
    return flags


def test_every_shared_flag_has_one_meaning():
    shared = sorted(f for f, verbs in verb_flags().items() if len(verbs) > 1)
    missing = [f for f in shared if f not in VOCABULARY]
    assert not missing, f"flags shared by several verbs without a meaning in the vocabulary: {missing}"


def test_flags_that_meant_two_things_now_mean_one():
    flags = verb_flags()
    assert flags["--window"] == {"kv-policy"}  # convert's tokens per sequence is --max-length
    assert "mix" not in flags["--finetune"] and "mix" in flags["--mix-epochs"]  # --finetune is the recovery shorthand
    assert "apply" not in flags["--epochs"] and "apply" in flags["--recover-epochs"]
    assert "compress" in flags["--limit"] and "compress" in flags["--calibration-limit"]
    assert "plan" in flags["--calibration-limit"] and "plan" not in flags.get("--calibration", set())
    assert "train translation" not in flags["--max-tokens"] and "train translation" in flags["--batch-tokens"]
    assert "train translation" not in flags["--layers"]  # --layers selects layers (headwise edit)
