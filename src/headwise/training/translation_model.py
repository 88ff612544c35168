"""A translation model trained from scratch: a joint BPE tokenizer trained on the train split (HF ``tokenizers``)
and a Marian-architecture encoder-decoder trained with the recipe of the shared Multi30k model (AdamW, linear
warm-up then inverse square-root decay, label smoothing, token-bucketed batches, best checkpoint by greedy
validation BLEU), with progress, resumable checkpoints and a cached result.

The output folder is a plain transformers folder at every moment after the first evaluation:
``AutoModelForSeq2SeqLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)`` give the best model so
far and its tokenizer. It also holds ``checkpoint.pt`` (the last training state, for ``resume``),
``training_log.json`` (the evaluations) and, once a budget is spent, ``result.json`` (the cached result).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..batching import collate
from ..errors import HeadwiseError
from ..io import atomic_write_text, json_text, read_text
from ..io.files import claimed
from ..progress import progress_bar
from ..tasks.bleu import corpus_bleu, translate
from ..tasks.corpus import train_tokenizer
from ..tasks.paths import shared_data
from ..tasks.translation import Translation
from .resume import differences, stop_signals
from .token_batches import token_batches

CHECKPOINT, LOG, RESULT = "checkpoint.pt", "training_log.json", "result.json"
BUDGET_FIELDS = ("minutes", "epochs", "max_steps", "eval_every", "checkpoint_minutes")  # may change on resume


@dataclass
class TranslationRecipe:
    """Tokenizer, architecture, optimisation and budget; the defaults are the shared Multi30k model's recipe.

    Training stops at the first budget reached: ``minutes`` (wall clock, evaluations included, summed over
    resumed runs), ``epochs`` or ``max_steps``; at least one must be set. Greedy BLEU on the first ``val_size``
    validation pairs is measured after every epoch (or every ``eval_every`` steps) and when training stops; the
    best model is kept. ``max_tokens``: padded source-or-target tokens per batch.
    """

    vocab_size: int = 8000
    min_frequency: int = 2
    d_model: int = 256
    layers: int = 3
    heads: int = 8
    ffn: int = 1024
    dropout: float = 0.1
    max_positions: int = 256
    learning_rate: float = 1e-3
    warmup: int = 800
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    max_tokens: int = 4096
    clip: float = 1.0
    minutes: float | None = 90.0
    epochs: int | None = None
    max_steps: int | None = None
    val_size: int = 500
    eval_every: int | None = None
    checkpoint_minutes: float = 5.0
    max_new_tokens: int = 96
    seed: int = 1

    def __post_init__(self) -> None:
        if self.minutes is None and self.epochs is None and self.max_steps is None:
            raise HeadwiseError("the training needs a budget: give minutes, epochs or max_steps")
        positive = ("vocab_size", "d_model", "layers", "heads", "ffn", "max_positions", "max_tokens", "val_size",
                    "max_new_tokens", "min_frequency")
        bad = [f for f in positive if getattr(self, f) < 1]
        bad += [f for f in ("minutes", "epochs", "max_steps", "eval_every", "checkpoint_minutes", "learning_rate")
                if getattr(self, f) is not None and getattr(self, f) <= 0]
        if bad:
            raise HeadwiseError(f"recipe: {bad[0]}={getattr(self, bad[0])} must be positive")
        if self.d_model % self.heads:
            raise HeadwiseError(f"recipe: d_model={self.d_model} must be a multiple of heads={self.heads}")
        if not 0 <= self.dropout < 1 or not 0 <= self.label_smoothing < 1:
            raise HeadwiseError("recipe: dropout and label_smoothing must lie in [0, 1)")
        if self.warmup < 0:
            raise HeadwiseError(f"recipe: warmup={self.warmup} must be 0 or more steps")

    def architecture(self) -> dict[str, Any]:
        """Everything but the budget (a resumed run must match it)."""
        return {k: v for k, v in asdict(self).items() if k not in BUDGET_FIELDS}


def marian_model(recipe: TranslationRecipe, tokenizer: Any) -> nn.Module:
    """A freshly initialised ``MarianMTModel`` (shared, tied embeddings; ReLU; post-norm) for ``tokenizer``."""
    from transformers import MarianConfig, MarianMTModel

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = MarianConfig(
        vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=recipe.d_model,
        encoder_layers=recipe.layers, decoder_layers=recipe.layers, encoder_attention_heads=recipe.heads,
        decoder_attention_heads=recipe.heads, encoder_ffn_dim=recipe.ffn, decoder_ffn_dim=recipe.ffn,
        dropout=recipe.dropout, attention_dropout=0.0, activation_dropout=0.0, activation_function="relu",
        max_position_embeddings=recipe.max_positions, pad_token_id=pad, eos_token_id=eos, bos_token_id=None,
        decoder_start_token_id=pad, forced_eos_token_id=eos, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    torch.manual_seed(recipe.seed)
    model = MarianMTModel(config)
    model.generation_config.update(decoder_start_token_id=pad, eos_token_id=eos, forced_eos_token_id=eos,
                                   pad_token_id=pad, bos_token_id=None)
    return model


def label_smoothed_nll(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Mean label-smoothed cross-entropy (float32) of ``logits`` ``[B, T, V]`` against ``labels`` ``[B, T]``
    (-100: not scored): ``(1 − ε)·NLL + ε·mean over the vocabulary of −log p``."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), label_smoothing=label_smoothing)


def smoothed_loss(model: nn.Module, batch: dict[str, torch.Tensor], label_smoothing: float) -> torch.Tensor:
    """``label_smoothed_nll`` of an encoder-decoder on ``batch`` (teacher forcing; decoder inputs are the labels
    shifted right behind the start token)."""
    from transformers.models.marian.modeling_marian import shift_tokens_right

    labels = batch["labels"]
    decoder_input_ids = shift_tokens_right(labels, model.config.pad_token_id, model.config.decoder_start_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=decoder_input_ids).logits
    return label_smoothed_nll(logits, labels, label_smoothing)


def _data_key(task: Translation, val_split: str) -> dict[str, Any]:
    """What identifies the training data (a resumed or cached run must match it)."""
    root = (Path(task.data_dir).expanduser().resolve() if task.data_dir
            else shared_data("multi30k", "--data-dir DIR (a folder of {split}.{lang}[.gz] files)").resolve())
    return {"data_dir": str(root), "src": task.src, "tgt": task.tgt, "train_split": task.train_split,
            "val_split": val_split, "max_length": task.max_length}


def _prepare_out(out: Path, key: dict[str, Any], recipe: TranslationRecipe, resume: bool,
                 force: bool) -> dict[str, Any] | None:
    """The cached result when ``out`` already holds this training, finished; None to train. Refuses to reuse a
    folder of another training or to start over without ``force``."""
    if out.exists() and not out.is_dir():
        raise HeadwiseError(f"{out} exists and is not a folder; choose another --out")
    if force and out.exists():
        shutil.rmtree(out)
    if not out.is_dir() or not any(out.iterdir()):
        return None
    if not (out / LOG).is_file():
        raise HeadwiseError(f"{out} is not empty and holds no headwise training; pick a new --out or pass --force")
    try:
        meta = json.loads(read_text(out / LOG))
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or not isinstance(meta.get("data"), dict) or not isinstance(meta.get("recipe"), dict):
        raise HeadwiseError(f"{out / LOG} is damaged; pass --force to start over")
    found = differences({**meta["data"], **meta["recipe"]}, {**key, **recipe.architecture()})
    if found:
        raise HeadwiseError(f"{out} holds a training with other data or another recipe ({'; '.join(found)}); pass "
                            "the same options, pick a new --out, or pass --force to start over")
    if not (out / CHECKPOINT).is_file():  # stopped before its first checkpoint: nothing to continue from
        if not resume:
            raise HeadwiseError(f"{out} holds a training stopped before its first checkpoint; pass --resume to "
                                "start it again or --force to start over")
        print(f"headwise: note: {out} holds no checkpoint yet (the training stopped before its first "
              "evaluation); starting it from the beginning", file=sys.stderr)
        return None
    result = out / RESULT
    if result.is_file() and not resume:
        return json.loads(result.read_text())
    if not resume:
        raise HeadwiseError(f"{out} holds an unfinished training; pass --resume to continue it or --force to "
                            "start over")
    return None


def _save_model(model: nn.Module, out: Path) -> None:
    """Write the model's transformers files into ``out``, each replaced atomically."""
    tmp = Path(tempfile.mkdtemp(prefix=".model.", dir=out))
    try:
        model.save_pretrained(tmp)
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save_checkpoint(out: Path, state: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{CHECKPOINT}.", dir=out)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, out / CHECKPOINT)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def train_translation_model(out: str | os.PathLike, task: Translation | None = None,
                            recipe: TranslationRecipe | None = None, *, val_split: str = "val",
                            resume: bool = False, force: bool = False, device: str | torch.device = "cpu",
                            progress: bool = True) -> dict[str, Any]:
    """Train a tokenizer and a Marian model from scratch on ``task``'s train split (default: Multi30k de→en) into
    ``out``; returns the result (``best_val_bleu``, ``best_step``, ``steps``, ``epochs``, ``minutes``, …).

    A finished training in ``out`` with the same data and recipe is returned as cached; an unfinished one
    continues with ``resume`` (budgets may grow); ``force`` starts over. Refuses another training's folder.
    On the CPU a resumed run continues exactly (the dropout RNG is restored); on ``device="cuda"`` up to dropout.
    ``out`` is claimed for the whole run (``io.files.claimed``): a second run on it is refused at once, in one line.
    """
    task = task or Translation()
    recipe = recipe or TranslationRecipe()
    train, val = task.corpus("train"), task.corpus(val_split).head(recipe.val_size)  # bad data fails first
    with claimed(out) as out:  # one writer: a second run on the same folder is refused at once
        return _train(out, task, recipe, train, val, val_split, resume, force, device, progress)


def _train(out: Path, task: Translation, recipe: TranslationRecipe, train: Any, val: Any, val_split: str,
           resume: bool, force: bool, device: str | torch.device, progress: bool) -> dict[str, Any]:
    key = _data_key(task, val_split)
    cached = _prepare_out(out, key, recipe, resume, force)
    if cached is not None:
        return cached
    run = _Run(out, task, recipe, train, val, key, device, progress)
    with stop_signals() as stop:  # SIGTERM/SIGINT: finish the step, save a complete checkpoint, stop
        while not run.spent() and not stop:
            run.epoch(stop)
        if stop:
            run.checkpoint()
            print(f"headwise: stopped by {stop.signal} at step {run.state['step']}; a complete checkpoint is saved "
                  f"in {out}: continue with --resume", file=sys.stderr)
            raise KeyboardInterrupt
        if not run.state["evals"] or run.state["evals"][-1]["step"] != run.state["step"]:
            run.evaluate()  # saves the last checkpoint
    result = run.result(len(train), len(val))
    atomic_write_text(out / RESULT, json_text(result, str(out / RESULT), indent=1))
    return result


class _Run:
    """One training in ``out``, new or resumed: the tokenizer, model, optimizer and schedule, and ``state`` (step,
    epoch, batch within it, seconds, best BLEU and step, evaluations, losses since the last one, RNG): what a
    checkpoint holds besides the weights."""

    def __init__(self, out: Path, task: Translation, recipe: TranslationRecipe, train: Any, val: Any, key: dict,
                 device: str | torch.device, progress: bool) -> None:
        from transformers import AutoTokenizer, get_inverse_sqrt_schedule

        self.out, self.recipe, self.val, self.key, self.device, self.progress = out, recipe, val, key, device, progress
        resuming = (out / CHECKPOINT).is_file()
        out.mkdir(parents=True, exist_ok=True)
        if resuming:
            self.tokenizer = AutoTokenizer.from_pretrained(out)
        else:
            self.tokenizer = train_tokenizer([*train.source, *train.target], recipe.vocab_size, recipe.min_frequency,
                                             nfkc=True)
            self.tokenizer.model_max_length = recipe.max_positions
            self.tokenizer.save_pretrained(out)
        self.model = marian_model(recipe, self.tokenizer).to(device)
        self.examples = task.examples(self.tokenizer, "train").items
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.98),
                                           eps=1e-9, weight_decay=recipe.weight_decay)
        self.scheduler = get_inverse_sqrt_schedule(self.optimizer, num_warmup_steps=recipe.warmup)
        if resuming:
            self.state = torch.load(out / CHECKPOINT, map_location="cpu", weights_only=False)
            self.model.load_state_dict(self.state.pop("model"))
            self.optimizer.load_state_dict(self.state.pop("optimizer"))
            self.scheduler.load_state_dict(self.state.pop("scheduler"))
            torch.set_rng_state(self.state["rng"])  # dropout continues as if never interrupted
        else:
            self.state = {"step": 0, "epoch": 0, "batch": 0, "seconds": 0.0, "best_bleu": -1.0, "best_step": None,
                          "evals": [], "losses": [], "rng": None}
            self._write_log()
        self.started = self.last_checkpoint = time.time()
        self.batches_in_epoch = 1

    def seconds(self) -> float:
        return self.state["seconds"] + time.time() - self.started

    def spent(self) -> bool:
        recipe, state = self.recipe, self.state
        return ((recipe.minutes is not None and self.seconds() >= 60 * recipe.minutes)
                or (recipe.max_steps is not None and state["step"] >= recipe.max_steps)
                or (recipe.epochs is not None and state["epoch"] >= recipe.epochs))

    def _write_log(self, indent: int | None = None) -> None:
        log = {"data": self.key, "recipe": self.recipe.architecture(), "evals": self.state["evals"]}
        atomic_write_text(self.out / LOG, json_text(log, str(self.out / LOG), indent))

    def evaluate(self) -> None:
        """BLEU on the validation pairs: logged, the best model saved, then a checkpoint."""
        state, recipe = self.state, self.recipe
        hypotheses = translate(self.model, self.tokenizer, self.val.source, batch_size=100,
                               max_new_tokens=recipe.max_new_tokens, progress=False)
        bleu = corpus_bleu(hypotheses, self.val.target)
        entry = {"step": state["step"], "epoch": state["epoch"] + state["batch"] / max(1, self.batches_in_epoch),
                 "minutes": round(self.seconds() / 60, 2), "loss": _mean(state["losses"]), "val_bleu": bleu}
        state["evals"].append(entry)
        state["losses"] = []
        if bleu > state["best_bleu"]:
            state["best_bleu"], state["best_step"] = bleu, state["step"]
            _save_model(self.model, self.out)
        self._write_log(indent=1)
        self.checkpoint()  # after every evaluation the folder resumes from exactly here
        if self.progress:
            loss = "—" if entry["loss"] is None else f"{entry['loss']:.3f}"
            tqdm.write(f"step {entry['step']} epoch {entry['epoch']:.2f}: loss {loss}, "
                       f"val BLEU {bleu:.2f} (best {state['best_bleu']:.2f})")

    def checkpoint(self) -> None:
        self.state.update(model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                          scheduler=self.scheduler.state_dict(), rng=torch.get_rng_state())
        self.state["seconds"] = self.seconds()
        _save_checkpoint(self.out, self.state)
        for k in ("model", "optimizer", "scheduler"):
            del self.state[k]
        self.started = self.last_checkpoint = time.time()

    def step(self, rows: list[int]) -> None:
        """One optimizer step on the examples ``rows``."""
        batch = {k: v.to(self.device) for k, v in
                 collate([self.examples[i] for i in rows], self.tokenizer.pad_token_id).items()}
        loss = smoothed_loss(self.model, batch, self.recipe.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.clip)
        self.optimizer.step()
        self.scheduler.step()
        self.state["step"] += 1
        self.state["batch"] += 1
        self.state["losses"].append(loss.item())

    def epoch(self, stop: Any) -> None:
        """The rest of the current epoch, until the budget is spent or a signal stops it."""
        state, recipe = self.state, self.recipe
        batches = token_batches([len(e["input_ids"]) for e in self.examples], [len(e["labels"]) for e in self.examples],
                                recipe.max_tokens, seed=recipe.seed, epoch=state["epoch"])
        self.batches_in_epoch = len(batches)
        self.model.train()
        bar = progress_bar(total=len(batches), initial=state["batch"], desc=f"epoch {state['epoch'] + 1}",
                           unit="step", disable=not self.progress)
        while state["batch"] < len(batches) and not self.spent() and not stop:
            self.step(batches[state["batch"]])
            bar.update(1)
            bar.set_postfix(loss=f"{state['losses'][-1]:.3f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}")
            if recipe.eval_every and state["step"] % recipe.eval_every == 0:
                self.evaluate()
                self.model.train()
            if time.time() - self.last_checkpoint >= 60 * recipe.checkpoint_minutes:
                self.checkpoint()
        bar.close()
        if state["batch"] >= len(batches):
            state["epoch"] += 1
            state["batch"] = 0
            if not recipe.eval_every:
                self.evaluate()

    def result(self, train_pairs: int, val_pairs: int) -> dict[str, Any]:
        state, last = self.state, self.state["evals"][-1]
        return {"headwise_translation_training": 1, "data": self.key, "recipe": asdict(self.recipe),
                "parameters": sum(p.numel() for p in self.model.parameters()), "train_pairs": train_pairs,
                "val_pairs": val_pairs, "steps": state["step"], "epochs": last["epoch"],
                "minutes": round(state["seconds"] / 60, 2), "best_val_bleu": state["best_bleu"],
                "best_step": state["best_step"], "last_val_bleu": last["val_bleu"], "model": str(self.out)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
