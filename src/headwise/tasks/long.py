"""The task ``long``: a RULER-style long-context suite (``tasks.long_data``) run through the cache a model
generates with, every question answered greedily after one prefill of its context.

A sample's context is prefilled once into a fresh cache (``model_cache``: the model's KV policy, its latent cache, or
the default ``DynamicCache``; or any ``make_cache`` an experiment gives, e.g. another policy at equal bytes); the
bytes that cache holds are recorded (``held_bytes``). Its questions are then answered from copies of it (``fork``:
the questions of one token length in one batch, each row its own copy of the prefilled context), as kvpress does:
the context is stored once, the questions come after it. Answers stop at an end-of-sequence token or after
``Question.max_new`` tokens, or as soon as they hold every expected string (more tokens could not change the
score), and are scored by RULER's string match (``long_data.score_answer``).

Scores (0–100): a sample's score is the mean of its questions'; a task's score at a length is the mean over its
samples; the suite's ``score`` is the macro-average over tasks and lengths. Its 95% interval resamples the samples
of every (task, length) cell (bootstrap); ``paired_difference`` gives the interval of the difference of two runs on
the same samples. ``ResultLog`` appends each sample's result to a JSON-lines file as it is scored, so a run resumes
where it stopped.
"""

from __future__ import annotations

import copy
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from ..compat import CACHE
from ..errors import HeadwiseError
from ..progress import progress_bar
from .base import Task
from .haystacks import Haystack, parse_haystacks
from .long_data import FAMILIES, SEED, TASKS, Question, Sample, SuiteSpec, draw, parse_lengths, score_answer

LOG_FORMAT = "headwise-long-samples"
LOG_VERSION = 1
BOOTSTRAP = 2000  # resamples of the intervals
MAX_ROWS = 8  # questions decoded together at most
CacheMaker = Callable[[nn.Module, int], Any]  # (model, tokens the sequence reaches) -> a fresh transformers Cache


# ---- caches -------------------------------------------------------------------------------------------------------

def model_cache(model: nn.Module, length: int) -> Any:
    """The cache ``model.generate()`` would build for a sequence of ``length`` tokens: a ``PolicyCache`` for a model
    with a KV policy, a ``LatentCache`` for a latent-converted one, else the default ``DynamicCache``."""
    from transformers.cache_utils import DynamicCache

    from ..conversion.cache import latent_cache, latent_sites
    from ..kvcache import policy_cache, policy_of

    if policy_of(model) is not None:
        return policy_cache(model, length=length)
    if latent_sites(model):
        return latent_cache(model)
    return DynamicCache(config=model.config)


def held_bytes(cache: Any) -> int:
    """Bytes of every tensor the ``cache`` object holds now, each storage once, whatever the cache's own count
    says: keys and values, a policy's ring buffers and padding rows, a latent cache's latents, rotary rows,
    positions and their cos/sin table (the modules it refers to are the model's, not counted)."""
    storages = {}
    for t in _tensors(cache, set()):
        if t.device.type != "meta":
            storages[(t.device, t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _tensors(obj: Any, seen: set[int]) -> Iterable[torch.Tensor]:
    """Every tensor reachable from ``obj`` through attributes and containers (modules are not entered)."""
    if id(obj) in seen or isinstance(obj, nn.Module):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, seen)
    elif isinstance(obj, (list, tuple, set)):
        for value in obj:
            yield from _tensors(value, seen)
    elif hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            yield from _tensors(value, seen)


def fork(cache: Any, rows: int, model: nn.Module) -> Any:
    """A copy of ``cache`` (one row) with its row repeated ``rows`` times; ``cache`` itself is left as it is. The
    copy shares ``model``'s modules and starts from ``cache``'s tensors, which ``batch_repeat_interleave`` replaces
    by new ones (so decoding into the copy never writes into ``cache``)."""
    memo: dict[int, Any] = {id(x): x for x in (*model.modules(), *model.parameters(), *model.buffers())}
    memo.update({id(t): t for t in _tensors(cache, set())})
    twin = copy.deepcopy(cache, memo)
    twin.batch_repeat_interleave(rows)
    return twin


def stop_tokens(model: nn.Module, tokenizer: Any) -> set[int]:
    """The end-of-sequence ids of the model's generation config and of the tokenizer."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(tokenizer.eos_token_id)
    return set(ids)


@torch.no_grad()
def prefill(model: nn.Module, ids: torch.Tensor, cache: Any, chunk: int | None = None) -> None:
    """Run ``ids [1, T]`` into ``cache`` (``chunk`` tokens per forward; None: all at once)."""
    step = chunk or ids.shape[1]
    for start in range(0, ids.shape[1], step):
        part = ids[:, start:start + step]
        position = torch.arange(start, start + part.shape[1], device=ids.device)[None]
        model(input_ids=part, position_ids=position, use_cache=True, logits_to_keep=1, **{CACHE: cache})


@torch.no_grad()
def greedy(model: nn.Module, cache: Any, ids: torch.Tensor, past: int, max_new: Sequence[int],
           stop: set[int], done: Callable[[int, list[int]], bool] | None = None) -> list[list[int]]:
    """Greedy answers of ``ids [R, Tq]`` (one question a row, all of one length) after the ``past`` tokens ``cache``
    holds for every row: row ``r`` stops after an id of ``stop`` (kept), after ``max_new[r]`` tokens, or once
    ``done(r, its tokens)``."""
    rows, length = ids.shape
    position = torch.arange(past, past + length, device=ids.device)[None].expand(rows, -1)
    logits = model(input_ids=ids, position_ids=position, use_cache=True, logits_to_keep=1, **{CACHE: cache}).logits
    answers: list[list[int]] = [[] for _ in range(rows)]
    alive = [True] * rows
    at = past + length
    while True:
        chosen = logits[:, -1].argmax(-1)
        for r, token in enumerate(chosen.tolist()):
            if alive[r]:
                answers[r].append(token)
                alive[r] = token not in stop and len(answers[r]) < max_new[r] and not (done and done(r, answers[r]))
        if not any(alive):
            return answers
        position = torch.full((rows, 1), at, device=ids.device)
        logits = model(input_ids=chosen[:, None], position_ids=position, use_cache=True, **{CACHE: cache}).logits
        at += 1


def run_sample(model: nn.Module, tokenizer: Any, sample: Sample, make_cache: CacheMaker | None = None,
               prefill_chunk: int | None = None) -> dict[str, Any]:
    """Prefill ``sample``'s context into ``make_cache(model, sample.length)`` (default ``model_cache``; a policy cache
    ``prefill_chunk`` tokens at a time, by default what ``generate`` would take), answer each
    question from a copy of it, score them. Returns the sample's record: its key, ``kv_bytes`` held after the
    context, ``score`` (0–100, the mean of its questions'), its wall and CPU seconds, and per question the
    answer, expected strings and score."""
    from ..kvcache import PolicyCache
    from ..kvcache.generation import prefill_chunk_for

    device = next(model.parameters()).device
    start, cpu = time.perf_counter(), time.process_time()
    cache = (make_cache or model_cache)(model, sample.length)
    context = torch.tensor([sample.context_ids], device=device)
    if prefill_chunk is None and isinstance(cache, PolicyCache):  # as generate() prefills under a policy
        prefill_chunk = prefill_chunk_for(model, "auto", 1, sample.length)
    prefill(model, context, cache, prefill_chunk)
    held = held_bytes(cache)
    stop = stop_tokens(model, tokenizer)
    by_length: dict[int, list[int]] = {}
    for i, q in enumerate(sample.questions):
        by_length.setdefault(len(q.ids), []).append(i)
    answers: dict[int, str] = {}
    for indices in by_length.values():
        for first in range(0, len(indices), MAX_ROWS):
            part = indices[first:first + MAX_ROWS]
            questions = [sample.questions[i] for i in part]
            ids = torch.tensor([q.ids for q in questions], device=device)

            def complete(r: int, tokens: list[int]) -> bool:  # every expected string found: the score is final
                q = questions[r]
                return score_answer(tokenizer.decode(tokens, skip_special_tokens=True), q.expected, q.match) == 1.0

            out = greedy(model, fork(cache, len(part), model), ids, len(sample.context_ids),
                         [q.max_new for q in questions], stop, complete)
            for i, tokens in zip(part, out):
                answers[i] = tokenizer.decode(tokens, skip_special_tokens=True)
    results = [{"answer": answers[i], "expected": list(q.expected), "match": q.match, "tag": q.tag,
                "score": 100 * score_answer(answers[i], q.expected, q.match)} for i, q in enumerate(sample.questions)]
    return {"key": sample.key, "task": sample.task, "length": sample.length, "index": sample.index,
            "context_tokens": len(sample.context_ids), "kv_bytes": held,
            "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
            "score": statistics.fmean(r["score"] for r in results), "questions": results}


# ---- results: a resumable log, scores and intervals -----------------------------------------------------------

class ResultLog:
    """Sample records appended to a JSON-lines file as they are scored (``path``), under a header naming what the
    samples were drawn from; reopening it with the same header resumes (a record per ``arm`` and sample key; a torn
    last line, from a killed run, is dropped), with another header is refused."""

    def __init__(self, path: str | os.PathLike, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.header = {"format": LOG_FORMAT, "version": LOG_VERSION, **header}
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        if self.path.is_file() and self.path.stat().st_size:
            self._read()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append(self.header, truncate=True)

    def _read(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        parsed = []
        for n, line in enumerate(lines):
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                if n != len(lines) - 1:
                    raise HeadwiseError(f"{self.path}: line {n + 1} is not JSON; the log is damaged: remove it (the "
                                        "run starts over) or give another output folder") from None
        if not parsed or parsed[0] != self.header:
            raise HeadwiseError(f"{self.path} holds samples of another suite or model (its header differs); give "
                                "another output folder, or remove the file to start over")
        for record in parsed[1:]:
            self.records[(record["arm"], record["key"])] = record
        if len(parsed) < len(lines):  # drop the torn line so the next append starts on a fresh line
            self._rewrite(parsed)

    def _rewrite(self, parsed: list[dict]) -> None:
        from ..io import atomic_write_text

        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in parsed))

    def _append(self, record: dict, truncate: bool = False) -> None:
        with open(self.path, "w" if truncate else "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def get(self, arm: str, key: str) -> dict[str, Any] | None:
        return self.records.get((arm, key))

    def add(self, arm: str, record: dict[str, Any]) -> dict[str, Any]:
        record = {"arm": arm, **record}
        self._append(record)
        self.records[(arm, record["key"])] = record
        return record

    def of(self, arm: str) -> list[dict[str, Any]]:
        return [r for (a, _), r in self.records.items() if a == arm]


LOG_FILE = "samples.jsonl"


def open_log(out: str | os.PathLike, resume: bool = False, force: bool = False) -> Path:
    """The per-sample log ``out/samples.jsonl`` of a run writing ``out`` (claimed for this process): an earlier run's
    log is continued with ``resume``, removed with ``force`` (the run starts over), else refused in one line."""
    from ..io.files import check_writable_dir, destination

    if (destination(out) / LOG_FILE).is_file() and not (resume or force):
        raise HeadwiseError(f"{out} holds an earlier run: pass --resume to continue it or --force to start over")
    path = check_writable_dir(out, overwrite=resume or force) / LOG_FILE
    if path.exists() and not resume:
        path.unlink()
    elif resume and not path.is_file():
        raise HeadwiseError(f"--resume: {path} does not exist; run without --resume first")
    return path


def _cells(records: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[float]]:
    cells: dict[tuple[str, int], list[float]] = {}
    for r in sorted(records, key=lambda r: (r["task"], r["length"], r["index"])):
        cells.setdefault((r["task"], r["length"]), []).append(r["score"])
    return cells


def _macro(cells: dict[tuple[str, int], list[float]]) -> float:
    return statistics.fmean(statistics.fmean(v) for v in cells.values())


def _bootstrap(statistic: Callable[[random.Random], float], reps: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    values = sorted(statistic(rng) for _ in range(reps))
    return values[int(0.025 * reps)], values[int(0.975 * reps) - 1]


def _resample(cells: dict[tuple[str, int], list[float]], rng: random.Random) -> dict[tuple[str, int], list[float]]:
    return {k: [v[rng.randrange(len(v))] for _ in v] for k, v in cells.items()}


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Scores of one run's sample records: ``score`` (macro-average over tasks and lengths, 0–100) with its 95%
    bootstrap interval ``score_ci``, per task (over lengths), per length (over tasks), per family, per (task,
    length) cell, sample and question counts, and the mean KV bytes held after the context per length."""
    if not records:
        raise HeadwiseError("no sample was scored")
    cells = _cells(records)
    tasks = sorted({t for t, _ in cells}, key=lambda t: TASKS.index(t) if t in TASKS else len(TASKS))
    lengths = sorted({n for _, n in cells})
    lo, hi = _bootstrap(lambda rng: _macro(_resample(cells, rng)))
    per_task = {t: statistics.fmean(statistics.fmean(cells[t, n]) for n in lengths if (t, n) in cells) for t in tasks}
    families: dict[str, list[float]] = {}
    for t in tasks:
        families.setdefault(FAMILIES.get(t, t), []).append(per_task[t])
    return {
        "score": _macro(cells), "score_ci": [lo, hi],
        "tasks": per_task,
        "lengths": {str(n): statistics.fmean(statistics.fmean(cells[t, n]) for t in tasks if (t, n) in cells)
                    for n in lengths},
        "families": {f: statistics.fmean(v) for f, v in families.items()},
        "task_families": {t: FAMILIES.get(t, t) for t in tasks},
        "cells": {t: {str(n): statistics.fmean(cells[t, n]) for n in lengths if (t, n) in cells} for t in tasks},
        "samples": {t: {str(n): len(cells[t, n]) for n in lengths if (t, n) in cells} for t in tasks},
        "questions": sum(len(r["questions"]) for r in records),
        "kv_bytes": {str(n): statistics.fmean(r["kv_bytes"] for r in records if r["length"] == n) for n in lengths},
    }


def paired_difference(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``score(a) − score(b)`` of two runs over the same samples (matched by haystack and key) and its 95% interval,
    the samples resampled together (paired bootstrap): ``{"difference", "ci": [lo, hi], "samples"}``."""
    by_key = {(r.get("haystack"), r["key"]): r for r in b}
    pairs = [(r, by_key[r.get("haystack"), r["key"]]) for r in a if (r.get("haystack"), r["key"]) in by_key]
    if not pairs:
        raise HeadwiseError("the two runs share no sample")
    cells: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for x, y in sorted(pairs, key=lambda p: p[0]["key"]):
        cells.setdefault((x["task"], x["length"]), []).append((x["score"], y["score"]))

    def diff(groups: dict[tuple[str, int], list[tuple[float, float]]]) -> float:
        return statistics.fmean(statistics.fmean(x - y for x, y in v) for v in groups.values())

    lo, hi = _bootstrap(lambda rng: diff({k: [v[rng.randrange(len(v))] for _ in v] for k, v in cells.items()}))
    return {"difference": diff(cells), "ci": [lo, hi], "samples": len(pairs)}


def summarize_haystacks(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``summarize`` of records of one haystack with its name (``haystack``); of several, ``summarize`` over all
    of them (each (task, length) cell pooling the haystacks' samples: with equal counts, the macro-average of the
    haystacks' scores) with ``haystacks``, each one's ``summarize``, and ``haystack``: their names joined."""
    names = list(dict.fromkeys(r.get("haystack", "generated") for r in records))
    if len(names) == 1:
        return summarize(records) | {"haystack": names[0]}
    return summarize(records) | {"haystack": ",".join(names), "haystacks": {
        name: summarize([r for r in records if r.get("haystack", "generated") == name]) for name in names}}


# ---- the task -----------------------------------------------------------------------------------------------------

def check_decoder(model: nn.Module, what: str = "task long") -> None:
    """Refuse an encoder-decoder or an encoder in one line: the suite prefills a decoder-only causal LM."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise HeadwiseError(f"{what} runs on decoder-only causal LMs; {type(model).__name__} is an encoder-decoder "
                            "(evaluate it with headwise eval translation)")
    name = type(model).__name__
    if not name.endswith(("ForCausalLM", "LMHeadModel")):
        raise HeadwiseError(f"{what} needs a causal LM with its language-modelling head; the model is a {name}: load "
                            "it with headwise.load_model(name, task='long')")


@dataclass
class LongContext(Task):
    """The long-context suite: ``lengths`` (``"2k,4k"`` or token counts), ``samples`` per task and length, ``seed``,
    ``tasks`` (default: all of ``long_data.TASKS``) and the haystack: ``haystack``, one or several of
    ``haystacks.HAYSTACKS`` or FILEs (comma-separated; None: ``generated``), or ``data``, a UTF-8 text file (the
    task's data, as in every task: the same as ``haystack=FILE``; give one of the two). Several haystacks run the
    same tasks, lengths and counts on each; the result reports each (``haystacks``) and their macro-average."""

    data: str | None = None
    lengths: str | tuple[int, ...] = "2k"
    samples: int | dict[str, int] = 8
    seed: int = SEED
    tasks: tuple[str, ...] = TASKS
    haystack: str | tuple[str, ...] | None = None

    name = "long"
    head = "causal-lm"
    metric = "score"

    def __post_init__(self) -> None:
        self.lengths = parse_lengths(self.lengths)
        self.tasks = tuple(self.tasks)
        if self.data is not None and self.haystack is not None:
            raise HeadwiseError(f"--data {self.data} and --haystack {self.haystack}: --data FILE is the haystack FILE; "
                                "give one of the two (several haystacks: --haystack prose,docs,FILE)")
        self.haystacks = (self.data,) if self.data is not None else parse_haystacks(self.haystack)
        self._specs: list[SuiteSpec] | None = None

    def specs(self) -> list[SuiteSpec]:
        """What the samples are drawn from, one spec per haystack (each read once)."""
        if self._specs is None:
            option = "--data" if self.data is not None else "--haystack"
            self._specs = [SuiteSpec(self.lengths, self.samples, self.seed, Haystack.of(name, option), self.tasks)
                           for name in self.haystacks]
        return self._specs

    def spec(self) -> SuiteSpec:
        """The spec of a suite of one haystack."""
        specs = self.specs()
        if len(specs) != 1:
            raise HeadwiseError(f"this suite has {len(specs)} haystacks ({', '.join(self.haystacks)}); take specs()")
        return specs[0]

    def check(self) -> None:
        self.specs()

    def identity(self) -> dict[str, Any]:
        """What fixes every sample's content: the spec's identity (one haystack) or each spec's (several)."""
        specs = self.specs()
        return specs[0].identity() if len(specs) == 1 else {"haystacks": [s.identity() for s in specs]}

    def describe(self) -> dict[str, Any]:
        """What the samples were drawn from (one haystack: its spec's description; several: each)."""
        specs = self.specs()
        return specs[0].describe() if len(specs) == 1 else {"haystacks": {s.haystack.name: s.describe()
                                                                          for s in specs}}

    def log(self, path: str | os.PathLike, model: nn.Module, name: str) -> ResultLog:
        """The resumable log at ``path`` for this suite and ``model`` (named ``name``): a log of samples drawn
        otherwise (seed, haystacks, needle formats) or of another model is refused; other lengths, tasks or counts
        extend it (a sample is the same whatever else is drawn)."""
        weights = sum(p.numel() for p in model.parameters())
        return ResultLog(path, {"suite": self.identity(), "model": name, "class": type(model).__name__,
                                "parameters": weights})

    def check_model(self, model: nn.Module, tokenizer: Any) -> None:
        from ..batching import check_context

        check_decoder(model)
        check_context(model, tokenizer, max(self.lengths), "--lengths")

    def evaluate(self, model: nn.Module, tokenizer: Any, *, progress: bool | None = None,
                 log: ResultLog | None = None, arm: str = "model", make_cache: CacheMaker | None = None,
                 prefill_chunk: int | None = None) -> dict[str, Any]:
        """``summarize``'s scores of ``run`` with ``haystack`` (its name) and ``drawn_from``; over several
        haystacks, the macro-average of theirs (every (haystack, task, length) cell counts the same) with
        ``haystacks``: each one's scores."""
        records = self.run(model, tokenizer, progress=progress, log=log, arm=arm, make_cache=make_cache,
                           prefill_chunk=prefill_chunk)
        return summarize_haystacks(records) | {"drawn_from": self.describe()}

    def run(self, model: nn.Module, tokenizer: Any, *, progress: bool | None = None, log: ResultLog | None = None,
            arm: str = "model", make_cache: CacheMaker | None = None,
            prefill_chunk: int | None = None) -> list[dict[str, Any]]:
        """Every sample's record (``run_sample``, with its ``haystack``'s name) through ``make_cache`` (default: the
        cache the model generates with); those ``log`` holds for ``arm`` (with several haystacks, ``arm/HAYSTACK``)
        are read, not run again, new ones appended to it."""
        from transformers.utils import logging as hf_logging

        self.check_model(model, tokenizer)
        specs = self.specs()
        was_training = model.training
        model.eval()
        records = []
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # long samples are long on purpose: no "longer than the maximum" notice
        try:
            jobs = [(spec, key) for spec in specs for key in spec.keys()]
            bar = progress_bar(jobs, desc=f"long {arm}", unit="sample",
                               disable=None if progress is None else not progress)
            for spec, (task, length, index) in bar:
                hay = spec.haystack.name
                logged = arm if len(specs) == 1 else f"{arm}/{hay}"
                key = f"{task}/{length}/{index}"
                record = log.get(logged, key) if log is not None else None
                if record is None:
                    sample = draw(tokenizer, task, length, index, spec)
                    record = run_sample(model, tokenizer, sample, make_cache, prefill_chunk)
                    record = log.add(logged, record) if log is not None else record
                records.append({**record, "haystack": hay})
                bar.set_postfix_str(f"{hay} {key} {record['score']:.0f}")
        finally:
            hf_logging.set_verbosity(verbosity)
            model.train(was_training)
        return records

    def examples(self, tokenizer: Any, split: str = "train"):
        raise HeadwiseError("task long is an evaluation suite: it has no training or calibration examples; train or "
                            "calibrate with --task lm")

    def texts(self, split: str = "calibration") -> list[str]:
        raise HeadwiseError("task long is an evaluation suite: it has no calibration texts; use --task lm")


VERIFY_TASKS = ("niah_single", "niah_multi", "qa")  # retrieval and facts: what dropping tokens puts at risk
VERIFY_HAYSTACK = "prose"  # natural text, which no calibration prompt of kv_policy is made of
RETENTION_FLOOR = 0.9  # a check whose policy keeps less than this share of the full cache's score is flagged


def retention(policy: dict[str, Any], full: dict[str, Any]) -> float | None:
    """The policy's score over the full cache's on the same samples (None when the full cache scores 0)."""
    return policy["score"] / full["score"] if full["score"] > 0 else None


def verify_policy(model: nn.Module, tokenizer: Any, policy: Any = None, length: int = 2048, samples: int = 4,
                  tasks: tuple[str, ...] = VERIFY_TASKS, data: str | None = None, seed: int = SEED,
                  progress: bool | None = None, haystack: str = VERIFY_HAYSTACK) -> dict[str, Any]:
    """A small subset of the suite (``tasks``, ``samples`` each, at ``length`` tokens) on the same samples with the
    full cache and through ``policy`` (a ``KVPolicy``; default: the model's own), on the ``haystack`` (natural
    prose by default) and on the user's ``data`` file when given. Returns ``{"full": scores, "policy": scores,
    "difference": policy − full with its paired 95% interval, "retention": policy / full, "haystacks": {name:
    the same four for that haystack alone}, "drawn_from": what the samples were drawn from}``, each scores dict with
    its sample and question counts (``summarize``). The samples never share a seed, a haystack or a needle format
    with ``kv_policy``'s calibration prompts (passkeys and fact lookups in filler text)."""
    from transformers.cache_utils import DynamicCache

    from ..kvcache import PolicyCache, policy_of
    from ..runtime import enable

    policy = policy or policy_of(model)
    if policy is None:
        raise HeadwiseError("verify_policy needs a KVPolicy (or a model with one: headwise.apply_kv_policy)")
    policy.validate(model)
    enable(model)
    names = (haystack,) + ((data,) if data is not None and data != haystack else ())
    task = LongContext(None, (length,), samples, seed, tasks, haystack=names)
    runs = {"full": lambda m, n: DynamicCache(config=m.config), "policy": lambda m, n: PolicyCache(policy, length=n)}
    records = {arm: task.run(model, tokenizer, progress=progress, arm=arm, make_cache=make)
               for arm, make in runs.items()}

    def compare(full: list[dict[str, Any]], mine: list[dict[str, Any]]) -> dict[str, Any]:
        out = {"full": summarize(full), "policy": summarize(mine), "difference": paired_difference(mine, full)}
        return out | {"retention": retention(out["policy"], out["full"])}

    each = {name: compare([r for r in records["full"] if r["haystack"] == name],
                          [r for r in records["policy"] if r["haystack"] == name]) for name in names}
    return compare(records["full"], records["policy"]) | {"haystacks": each, "drawn_from": task.describe()}
