"""Language modelling: perplexity over a text, next-token loss.

Text: a file (UTF-8 lines) or a 🤗 ``datasets`` name (``name[:config]``, e.g. ``wikitext:wikitext-2-raw-v1``,
needs internet). Split policy for a single file: the first 90% of its lines train and calibrate, the last 10%
evaluate (``split="all"`` evaluates the whole file); a ``datasets`` name uses its ``train`` and ``test`` splits.
Lines are joined with newlines and tokenised once, without special tokens.

Perplexity uses strided windows as in transformers' guide: windows of ``max_length`` tokens start every
``stride`` tokens and each scores only the tokens the previous window did not (``stride = max_length``: disjoint
windows). ``max_tokens`` caps the evaluated stream. ``perplexity = exp(Σ NLL / scored tokens)``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..batching import LABEL_PAD, Examples, check_context
from ..compat import no_cache
from ..errors import HeadwiseError
from ..runtime.into_grad import head_gradient_into_grad
from .base import Task, TaskOutputs
from .distillation import distillation_loss, headed_kl, mean_over_positions
from .metrics import finite_metrics
from .paths import existing_file, read_lines, shared_data
from ..progress import progress_bar

TRAIN_SHARE = 0.9
MAX_EXP = 709.0  # math.exp overflows above this
SPLITS = ("eval", "train", "calibration", "all")


STREAM_MARGIN = 64  # tokens read past --max-tokens, so that where the text was cut touches none of those kept
STREAM_CHARS_PER_TOKEN = 8  # the first prefix tried: about twice the characters per token of English subwords
LOSS_CHUNK_BYTES = 8 * 2**20  # float32 logits of one chunk of positions (bounds the loss's memory)
LOSS_CHUNK_MIN_ROWS = 16  # the least positions per chunk (a large vocabulary keeps its matmuls efficient)


@contextmanager
def _head_input(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While the block runs, the output embeddings (``lm_head``) record their input hidden states ``[B, T, D]``
    and project only its last position: the full ``[B, T, V]`` logits are never built."""
    seen: list[torch.Tensor] = []

    def last_only(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        seen.append(args[0] if args else None)
        return ((args[0][:, -1:],) + args[1:], kwargs) if args else None

    handle = model.get_output_embeddings().register_forward_pre_hook(last_only, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def final_hidden(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int] | None:
    """The hidden states ``[B, T, D]`` the model's ``lm_head`` turns into its logits on ``inputs`` and the
    vocabulary size V, found with one forward that projects only the last position; ``None`` when the logits
    are not exactly ``lm_head(hidden)`` (no output embeddings, several or no calls, a logit post-processing such
    as soft-capping, scaling or a bias added after the head)."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Module):
        return None
    with _head_input(model) as seen:
        logits = model(**inputs, **no_cache(model)).logits
    if len(seen) != 1 or seen[0] is None or seen[0].dim() != 3 or logits.shape[1] != 1:
        return None
    hidden = seen[0]  # [B, T, D]
    if hidden.device.type != "meta":
        with torch.no_grad():  # same op on the same input: bit-equal unless the model post-processes its logits
            if not torch.equal(head(hidden[:, -1:]).to(logits.dtype), logits.detach()):
                return None
    return hidden, logits.shape[-1]


def logit_rows(vocab: int) -> int:
    """Positions per chunk of logits: ``LOSS_CHUNK_BYTES`` of float32 logits over a vocabulary of ``vocab``, at
    least ``LOSS_CHUNK_MIN_ROWS``."""
    return max(LOSS_CHUNK_MIN_ROWS, LOSS_CHUNK_BYTES // (4 * vocab))


class _FrozenHeadNLL(torch.autograd.Function):
    """Next-token NLL ``[N]`` through a frozen ``nn.Linear`` head whose input ``[N, D]`` needs a gradient, built
    ``step`` rows at a time: the forward also computes ``∂nll_i/∂hidden_i = (softmax(logits_i) − onehot(target_i))
    · W`` (``[N, D]``, the head's dtype) and keeps only that, so the backward scales it in place and returns it (no
    logits kept, none recomputed: two head matmuls per chunk, not three; one ``[N, D]`` buffer in the forward and
    the backward, not one per chunk and their sum). The backward can run once (a second one is refused)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                target: torch.Tensor, step: int) -> torch.Tensor:
        nll = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)
        unit = torch.empty(hidden.shape, dtype=weight.dtype, device=hidden.device)
        for i in range(0, len(hidden), step):
            logits = F.linear(hidden[i : i + step], weight, bias).float()  # [n, V]
            rows = target[i : i + step]
            nll[i : i + step] = F.cross_entropy(logits, rows, reduction="none")
            probs = logits.softmax(-1)
            probs[torch.arange(len(rows), device=rows.device), rows] -= 1.0
            torch.matmul(probs.to(weight.dtype), weight, out=unit[i : i + step])
        ctx.unit = unit
        return nll

    @staticmethod
    def backward(ctx, grad_nll: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        unit, ctx.unit = ctx.unit, None
        if unit is None:
            raise HeadwiseError("the language-model loss's gradient was taken twice from one forward (retain_graph): "
                                "run the forward again for each backward")
        return unit.mul_(grad_nll[:, None]), None, None, None, None


ChunkLosses = Callable[[torch.Tensor, slice], torch.Tensor]  # (logits [n, V], their rows) -> losses [n, K]


class _HeadChunks(torch.autograd.Function):
    """Per-position losses ``[N, K]`` of a plain ``nn.Linear`` head's logits, built ``step`` rows at a time; the
    backward rebuilds each chunk's logits, takes the losses' gradient on them and adds the head's weight (and bias)
    gradient into one buffer: the backward holds one ``[V, D]`` weight gradient, not one per chunk and a sum (a
    checkpoint per chunk makes a ``[V, D]`` gradient in every chunk's backward, and autograd adds them up)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, losses: ChunkLosses,
                step: int) -> torch.Tensor:
        ctx.save_for_backward(hidden, weight, bias)
        ctx.losses, ctx.step = losses, step
        return torch.cat([losses(F.linear(hidden[i : i + step], weight, bias), slice(i, i + step))
                          for i in range(0, len(hidden), step)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias = ctx.saved_tensors
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        d_hidden = torch.empty_like(hidden) if wants_hidden else None
        d_weight = torch.zeros_like(weight) if wants_weight else None
        d_bias = torch.zeros_like(bias) if wants_bias else None
        for i in range(0, len(hidden), ctx.step):
            rows = slice(i, i + ctx.step)
            with torch.enable_grad():
                logits = F.linear(hidden[rows], weight, bias).detach().requires_grad_()
                (d_logits,) = torch.autograd.grad(ctx.losses(logits, rows), logits, grad[rows])
            d_logits = d_logits.to(weight.dtype)  # [n, V]
            if wants_hidden:
                d_hidden[rows] = d_logits @ weight
            if wants_weight:
                d_weight.addmm_(d_logits.t(), hidden[rows])
            if wants_bias:
                d_bias += d_logits.sum(0)
        if wants_weight and head_gradient_into_grad(weight):  # a tied embedding's sparse rows follow, in place
            weight.grad = d_weight if weight.grad is None else weight.grad.add_(d_weight)
            d_weight = None
        return d_hidden, d_weight, d_bias, None, None


def head_losses(head: nn.Module, hidden: torch.Tensor, losses: ChunkLosses, vocab: int) -> torch.Tensor:
    """``losses(head(hidden[rows]), rows)`` ``[N, K]`` over ``hidden`` ``[N, D]``, ``logit_rows(vocab)`` rows at a
    time, never holding more than one chunk's logits: without gradients a plain loop; with them, through a plain
    ``nn.Linear`` head, ``_HeadChunks`` (one weight gradient buffer), through another head a checkpoint per chunk
    (its logits recomputed in the backward)."""
    step = logit_rows(vocab)
    spans = [slice(i, i + step) for i in range(0, len(hidden), step)]
    trains = any(p.requires_grad for p in head.parameters())
    if not torch.is_grad_enabled() or not (hidden.requires_grad or trains):
        return torch.cat([losses(head(hidden[rows]), rows) for rows in spans])
    if type(head) is nn.Linear:
        return _HeadChunks.apply(hidden, head.weight, head.bias, losses, step)
    return torch.cat([checkpoint(lambda h, rows=rows: losses(head(h), rows), hidden[rows], use_reentrant=False)
                      for rows in spans])


def next_token_nll(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL ``[B]`` (float32) and the number of scored tokens ``[B]``; ``labels`` ``[B, T]`` is
    ``input_ids`` with unscored positions set to -100 (position ``t`` predicts ``labels[t + 1]``).

    The one place the language-modelling loss is computed. The vocabulary-sized logits are built in chunks of
    positions (``LOSS_CHUNK_BYTES`` of float32 logits each) from the hidden states the ``lm_head`` reads; with
    gradients on, each chunk is checkpointed (its logits recomputed in the backward, never kept) or, through a
    frozen head, keeps only its ``[n, D]`` input gradient, so neither the forward nor the backward holds
    ``[B, T, V]``. Models whose logits are not exactly ``lm_head(hidden)`` (soft-capping, logit scaling) are run a
    second time with their full logits."""
    target = labels[:, 1:]
    scored = target != LABEL_PAD
    found = final_hidden(model, {"input_ids": input_ids, "attention_mask": attention_mask})
    if found is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, **no_cache(model)).logits[:, :-1].float()
        nll = F.cross_entropy(logits.transpose(1, 2), target.clamp(min=0), reduction="none")
        return (nll * scored).sum(1), scored.sum(1)
    (hidden, vocab), head = found, model.get_output_embeddings()
    # every position through the head (the last predicts nothing: a target 0, weighed 0), so that the head reads
    # the hidden states as they are: no [B, T − 1, D] slice to copy in the forward and to scatter into in the backward
    nll = head_nll(head, hidden, F.pad(target.clamp(min=0), (0, 1)), vocab)[:, :-1]
    return (nll * scored).sum(1), scored.sum(1)


def head_nll(head: nn.Module, hidden: torch.Tensor, target: torch.Tensor, vocab: int) -> torch.Tensor:
    """Next-token NLL ``[B, T]`` (float32) of ``head(hidden)`` (``hidden`` ``[B, T, D]``, ``target`` ``[B, T]`` ≥ 0)
    built a chunk of ``logit_rows(vocab)`` positions at a time (see ``next_token_nll``): through a frozen plain
    ``nn.Linear`` head with a gradient for ``hidden``, ``_FrozenHeadNLL``; else ``head_losses``."""
    flat, goal = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)  # [B·T, D], [B·T]
    frozen = type(head) is nn.Linear and not any(p.requires_grad for p in head.parameters())
    if torch.is_grad_enabled() and flat.requires_grad and frozen:
        return _FrozenHeadNLL.apply(flat, head.weight, head.bias, goal, logit_rows(vocab)).view_as(target)
    return head_losses(head, flat, lambda logits, rows: nll_of(logits, goal[rows])[:, None], vocab).view_as(target)


def nll_of(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token NLL ``[n]`` (float32) of logits ``[n, V]`` for ``target`` ``[n]`` (≥ 0)."""
    return F.cross_entropy(logits.float(), target, reduction="none")


@dataclass
class LanguageModeling(Task):
    """``data``: a text file or a ``datasets`` name (default: shared/data/wikitext-2/valid.txt);
    ``split``: which part is evaluated (see the module docstring)."""

    data: str | None = None
    split: str = "eval"
    max_length: int = 1024
    stride: int | None = None
    max_tokens: int | None = None

    name = "lm"
    head = "causal-lm"
    metric = "perplexity"
    higher_is_better = False
    train_defaults = {"batch_size": 4, "learning_rate": 5e-5}

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise HeadwiseError(f"unknown lm split {self.split!r}; use one of {', '.join(SPLITS)}")
        self.stride = self.stride or self.max_length
        if not 0 < self.stride <= self.max_length:
            raise HeadwiseError(f"--stride {self.stride} must be between 1 and --max-length {self.max_length}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise HeadwiseError(f"--max-tokens {self.max_tokens}: give at least 2 tokens")
        self._lines: dict[str, list[str]] = {}

    # ---- data ---------------------------------------------------------------------------------------------
    def source(self) -> str:
        if self.data is None:
            return str(shared_data("wikitext-2/valid.txt", "--data FILE (a UTF-8 text file)"))
        return self.data

    def _is_dataset_name(self) -> bool:
        return self.data is not None and not Path(self.data).expanduser().exists() and ":" in self.data

    def check(self) -> None:
        self.texts("eval")

    def texts(self, split: str = "eval") -> list[str]:
        """The lines of ``split`` (``"calibration"`` is the train part; ``"eval"`` the part chosen by
        ``self.split``)."""
        split = "train" if split == "calibration" else self.split if split == "eval" else split
        if split not in self._lines:
            self._lines[split] = self._read(split)
        return self._lines[split]

    def _read(self, split: str) -> list[str]:
        if self._is_dataset_name():
            return _dataset_lines(self.data, "train" if split == "train" else "test")
        path = existing_file(self.source(), "language-modelling text file",
                             "pass --data FILE (UTF-8 text) or a datasets name such as wikitext:wikitext-2-raw-v1")
        lines = read_lines(path)
        if not any(line.strip() for line in lines):
            raise HeadwiseError(f"{path} holds no text; pass a file with at least one non-empty line")
        cut = int(len(lines) * TRAIN_SHARE)
        part = {"all": lines, "train": lines[:cut], "eval": lines[cut:]}[split]
        if not any(line.strip() for line in part):
            raise HeadwiseError(f"{path}: its {split} part (split policy: first {TRAIN_SHARE:.0%} of lines train, "
                                "the rest evaluates) holds no text; give a longer file")
        return part

    def token_stream(self, tokenizer: Any, split: str) -> torch.Tensor:
        """Token ids ``[N]`` of a split's text, cut to ``max_tokens``. With a cut, only a prefix of the text is
        tokenised: one long enough for ``STREAM_MARGIN`` tokens beyond the cut (doubled until it is, or until it is
        the whole text), so the kept tokens are those of the whole text and the tokenizer never holds the whole
        split's encoding (on WikiText-2's validation text, 0.15x SmolLM2-135M's weights for 1,024 tokens)."""
        from transformers.utils import logging as hf_logging

        text = "\n".join(self.texts(split))
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the stream is longer than the context on purpose: it is windowed
        try:
            chars = len(text) if self.max_tokens is None else STREAM_CHARS_PER_TOKEN * (self.max_tokens + STREAM_MARGIN)
            while True:
                ids = tokenizer(text[:chars], add_special_tokens=False)["input_ids"]
                if chars >= len(text) or len(ids) >= self.max_tokens + STREAM_MARGIN:
                    break
                chars *= 2
        finally:
            hf_logging.set_verbosity(verbosity)
        if self.max_tokens is not None:
            ids = ids[: self.max_tokens]
        if len(ids) < 2:
            raise HeadwiseError(f"the {split} text tokenises to {len(ids)} token(s); perplexity needs at least 2")
        return torch.tensor(ids, dtype=torch.long)

    def windows(self, n: int) -> list[tuple[int, int, int]]:
        """``(begin, end, first scored position)`` of the strided windows over ``n`` tokens."""
        out, prev_end = [], 0
        for begin in range(0, n, self.stride):
            end = min(begin + self.max_length, n)
            out.append((begin, end, prev_end - begin if prev_end > begin else 0))
            prev_end = end
            if end == n:
                break
        return out

    def examples(self, tokenizer: Any, split: str = "train") -> Examples:
        """Windows of the split's token stream (disjoint for training; strided for ``"eval"``) as
        ``{"input_ids", "labels"}`` with unscored positions labelled -100."""
        ids = self.token_stream(tokenizer, self.split if split == "eval" else split)
        items = []
        for begin, end, first in self.windows(len(ids)) if split == "eval" else _disjoint(len(ids), self.max_length):
            window = ids[begin:end].tolist()
            items.append({"input_ids": window, "labels": [LABEL_PAD] * first + window[first:]})
        return Examples(items, 0, self.source())

    # ---- metrics and loss -----------------------------------------------------------------------------------
    def check_model(self, model: nn.Module, tokenizer: Any) -> None:
        super().check_model(model, tokenizer)
        check_context(model, tokenizer, self.max_length)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, tokenizer: Any, *, progress: bool | None = None) -> dict[str, float]:
        self.check_model(model, tokenizer)
        device = next(model.parameters()).device
        ids = self.token_stream(tokenizer, self.split)
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for begin, end, first in progress_bar(self.windows(len(ids)), desc="perplexity", unit="window",
                                      disable=None if progress is None else not progress):
            window = ids[begin:end].to(device)[None]
            labels = window.clone()
            labels[:, :first] = LABEL_PAD
            nll, scored = next_token_nll(model, window, None, labels)
            total, count = total + float(nll.sum()), count + int(scored.sum())
        model.train(was_training)
        perplexity = math.inf if total / count >= MAX_EXP else math.exp(total / count)  # refused just below
        return finite_metrics({"perplexity": perplexity, "nll": total / count, "tokens": count,
                               "windows": len(self.windows(len(ids)))}, f"lm {self.data or 'text'}")

    def outputs(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutputs:
        """Next-token logits (position ``t`` predicts token ``t + 1``), scored positions masked: the hidden states
        ``[B, T-1, D]`` with the output head (``TaskOutputs.head``: the losses build the logits in chunks) when the
        logits are exactly ``lm_head(hidden)`` (``final_hidden``), else the logits ``[B, T-1, V]``."""
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask")}
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        found = final_hidden(model, inputs) if isinstance(head, nn.Linear) else None
        if found is None:
            return self.outputs_from(model(**inputs, **no_cache(model)).logits[:, :-1], batch)
        return self.outputs_from(found[0][:, :-1], batch, head)

    @staticmethod
    def outputs_from(values: torch.Tensor, batch: dict[str, torch.Tensor], head: nn.Linear | None = None
                     ) -> TaskOutputs:
        """``TaskOutputs`` of next-token logits ``[B, T-1, V]`` (or hidden states ``[B, T-1, D]`` and ``head``)."""
        return TaskOutputs(values, "logits", batch["labels"][:, 1:] != LABEL_PAD, head)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token NLL per window ``[B]`` (``next_token_nll``: no full-vocabulary logits); equal to
        ``loss_from(outputs(model, batch), batch)``. Without ``labels`` every real token is scored (the loss of the
        text itself: a batch of model inputs, as ``analyze`` passes)."""
        labels = batch.get("labels")
        if labels is None:
            mask = batch.get("attention_mask")
            labels = batch["input_ids"] if mask is None else batch["input_ids"].masked_fill(mask == 0, LABEL_PAD)
        nll, scored = next_token_nll(model, batch["input_ids"], batch.get("attention_mask"), labels)
        return nll / scored.clamp(min=1)

    def loss_from(self, outputs: TaskOutputs, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token NLL per window ``[B]`` from ``outputs`` (logits built in chunks through its head)."""
        target = batch["labels"][:, 1:].clamp(min=0)
        if outputs.head is not None:
            nll = head_nll(outputs.head, outputs.values, target, outputs.classes)
        else:
            nll = F.cross_entropy(outputs.values.float().transpose(1, 2), target, reduction="none")
        return mean_over_positions(nll, outputs.mask)

    def loss_and_distillation(self, student: TaskOutputs, teacher: TaskOutputs, batch: dict[str, torch.Tensor],
                              temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss_from(student, batch), headed_logit_distillation(student, teacher))`` ``[B]`` each, from one pass
        over the student's logits when they come through its head (``headed_kl`` with the targets): the backward
        holds one gradient of the head's weight for both losses, not one each."""
        if student.head is None:
            return self.loss_from(student, batch), distillation_loss(student, teacher, temperature=temperature)
        both = headed_kl(student, teacher, temperature, batch["labels"][:, 1:].clamp(min=0))  # [B, T, 2]
        return mean_over_positions(both[..., 1], student.mask), mean_over_positions(both[..., 0], student.mask)


def _disjoint(n: int, length: int) -> list[tuple[int, int, int]]:
    return [(b, min(b + length, n), 0) for b in range(0, n - 1, length) if min(b + length, n) - b >= 2]


def _dataset_lines(spec: str, split: str) -> list[str]:
    """Lines of the ``text`` column of a 🤗 dataset ``name:config`` (needs the ``datasets`` package and internet)."""
    name, _, config = spec.partition(":")
    try:
        import datasets
    except ImportError:
        raise HeadwiseError(f"--data {spec}: a dataset name needs the datasets package (pip install datasets); "
                            "or pass a text file") from None
    try:
        data = datasets.load_dataset(name, config or None, split=split)
    except Exception as err:  # noqa: BLE001 - the hub raises many kinds; all mean the same to the user
        raise HeadwiseError(f"could not load dataset {spec!r} split {split}: {str(err).splitlines()[0]}; pass a "
                            "local text file with --data FILE") from err
    if "text" not in data.column_names:
        raise HeadwiseError(f"dataset {spec!r} has no 'text' column (columns: {', '.join(data.column_names)})")
    return list(data["text"])
