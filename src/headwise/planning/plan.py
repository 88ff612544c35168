"""``headwise.plan``: a budget in, a measured Pareto front and a recommended edit out.

The steps of ``plan``, each a named function: ``_check`` (the settings, the budget against the model, before any
work), ``settle_calibration`` (enough calibration tokens for every calibrated method, or a method skipped or refused,
before any work), ``Bench`` (the calibration, timing and probe batches; ``Bench.base`` measures the unedited model),
``rank_heads`` (the head order, by the ``rank`` hook of a method of role ``"heads"``, only when one is tried),
``candidates.candidates`` (every planned method's levels; the output error on the probe ranks layers for a
mechanism), ``measure_singles`` (each level applied in place and measured: task score on the dev data, costs after
physical removal, latency beside the unedited model; the model is restored exactly, ``edits.edited``: no tensor
is copied, the attention modules are set aside while stand-ins sharing their tensors take the edit, and the model
is copied only once, as the recovery teacher and restore source when ``recover`` trains every weight),
``measure_combined`` (pairs of heads removed × another method, predicted from the singles, the best inside the
budget measured too) and ``_finish`` (the front over measured points only; the recommended plan is the best-scoring
measured point that meets the whole budget).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shlex
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch import nn

from ..contract import Method, measured
from ..declaration import PlanContext, Ranking
from ..errors import HeadwiseError, HeadwiseNote, renamed
from ..io import atomic_write_text, json_text, read_text
from ..progress import progress_bar
from ..sites import find_sites
from ..tasks import Task, get_task
from ..training import finetune, recover
from ..training.recovery import MODES
from .axes import COST_KEYS
from .budget import Budget
from .candidates import Candidate, candidates, plannable
from .costs import measure_latency, sequence_length, static_costs
from .edits import Edit, apply_edit, edited
from .pareto import front
from .proxies import outputs, relative_error
from .search import finalists

SCHEMA = "headwise.plan/2"  # 2: an edit is a list of method records (1: five fixed fields)


@dataclass
class Point:
    """One measured edit. ``measured``: ``score`` (the task's main metric), ``metrics`` (all of them) and the
    costs (``heads``, ``kv_heads``, ``attention_params``, ``flops``, ``kv_bytes``, ``latency`` ratio,
    ``latency_ms``); ``predicted``: the same keys as predicted before measuring (combinations only);
    ``methods``: the registered names of the edit's methods."""

    name: str
    kind: str  # "base", "single" or "combined"
    methods: list[str]
    edit: Edit
    measured: dict[str, Any]
    predicted: dict[str, Any] | None = None
    proxy: float | None = None
    parts: list[str] = field(default_factory=list)
    meets_budget: bool = False
    on_front: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["edit"] = self.edit.records()
        out["describe"] = self.edit.describe()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Point":
        """A point of a plan.json; refuses a wrong shape with one line naming the point and the field."""
        name = d.get("name") if isinstance(d, dict) else None
        where = f"point {name!r}" if isinstance(name, str) else "a point"
        if not isinstance(d, dict):
            raise HeadwiseError(f"{where} is a {type(d).__name__}, not a mapping")
        known = {f.name for f in fields(cls)} | {"describe"}
        unknown = sorted(map(str, set(d) - known))
        missing = [k for k in ("name", "kind", "methods", "edit", "measured") if k not in d]
        problems = [f"unknown fields {', '.join(unknown)}"] * bool(unknown) + \
            [f"no {', '.join(missing)}"] * bool(missing)
        if problems:
            raise HeadwiseError(f"{where} has {'; '.join(problems)}")
        kinds = ("base", "single", "combined")
        if not isinstance(name, str) or d["kind"] not in kinds or not isinstance(d["methods"], list) \
                or not isinstance(d["measured"], dict) or not _number(d["measured"].get("score")):
            raise HeadwiseError(f"{where}: needs a name, a kind ({', '.join(kinds)}), a methods list and a "
                                "measured mapping with a numeric score")
        try:
            edit = Edit.from_records(d["edit"])
        except HeadwiseError as err:
            raise HeadwiseError(f"{where}: {err}") from None
        return cls(**{**{k: v for k, v in d.items() if k != "describe"}, "edit": edit})


@dataclass
class Plan:
    """What ``plan`` found: every measured point, the front, the recommended one, and how to apply it."""

    model: str
    task: dict[str, Any]  # {"name", "options", "metric", "higher_is_better"}
    budget: dict[str, float]
    settings: dict[str, Any]
    points: list[Point]
    proxies: dict[str, Any]
    layers: dict[str, dict[str, Any]]  # per site: heads, importance per head, mechanism error
    recommended: str | None
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why it was not tried
    schema: str = SCHEMA
    fingerprint: dict[str, Any] | None = None  # the model it was made on (``fingerprint``); None: an older plan

    # ---- views ---------------------------------------------------------------------------------------------
    @property
    def base(self) -> Point:
        return next(p for p in self.points if p.kind == "base")

    @property
    def frontier(self) -> list[Point]:
        """Measured points on the Pareto front (score against every cost axis at once), best score first."""
        return sorted((p for p in self.points if p.on_front), key=lambda p: -self.sign * p.measured["score"])

    @property
    def recommended_point(self) -> Point | None:
        return next((p for p in self.points if p.name == self.recommended), None)

    @property
    def sign(self) -> float:
        return 1.0 if self.task["higher_is_better"] else -1.0

    def point(self, name: str | None = None) -> Point:
        """The point called ``name`` (default: the recommended one)."""
        name = name or self.recommended
        if name is None:
            raise HeadwiseError("no measured point meets the budget, so there is no recommended plan; pick one with "
                                f"--point NAME ({', '.join(p.name for p in self.points)})")
        for p in self.points:
            if p.name == name:
                return p
        raise HeadwiseError(f"plan has no point {name!r}; points: {', '.join(p.name for p in self.points)}")

    def command(self, path: str = "plan.json", point: str | None = None, out: str = "headwise-applied") -> str:
        """The ``headwise apply`` command line for ``point`` (default: recommended)."""
        parts = ["headwise", "apply", path, "--out", out]
        if point and point != self.recommended:
            parts += ["--point", point]
        if self.settings.get("recover", "none") != "none":
            parts += ["--recover", self.settings["recover"]]
        return shlex.join(parts)

    # ---- acting --------------------------------------------------------------------------------------------
    def make_task(self) -> Task:
        return get_task(self.task["name"], **self.task["options"])

    def calibration(self, tokenizer: Any, task: Task | None = None, device: torch.device | str = "cpu") -> list[dict]:
        """The calibration batches the plan measured with (``calibration_set`` of its settings)."""
        return calibration_set(task or self.make_task(), tokenizer, self.settings["calibration"],
                               self.settings.get("calibration_uncapped", False), device)

    def execute(self, model: nn.Module, tokenizer: Any = None, point: str | None = None, task: Task | None = None,
                progress: bool | None = False) -> nn.Module:
        """Perform the recommended edit (or ``point``) on ``model`` in place, exactly as it was measured
        (calibrated parts need ``tokenizer`` to rebuild the same calibration batches). No recovery here: see
        ``headwise.recover``."""
        self.check_model(model)
        edit = self.point(point).edit
        calibration = None
        if edit.needs_calibration():
            if tokenizer is None:
                raise HeadwiseError(f"point {self.point(point).name} uses calibrated edits; pass the tokenizer")
            calibration = self.calibration(tokenizer, task, next(model.parameters()).device)
        return apply_edit(model, edit, calibration, progress)

    apply = renamed(execute, "Plan.apply")

    def check_model(self, model: nn.Module) -> str | None:
        """Refuse a model other than the one the plan was made on (site shapes and current heads differ, e.g. its
        heads already pruned), listing what differs; returns a note when the plan predates fingerprints and
        cannot be checked, else None."""
        if self.fingerprint is None:
            return ("this plan was written before plans recorded their model, so headwise cannot check that the "
                    "model is the one it was planned on")
        now = fingerprint(model)
        if now["hash"] == self.fingerprint.get("hash"):
            return None
        diff = fingerprint_differences(self.fingerprint.get("sites", {}), now["sites"])
        shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise HeadwiseError(f"the plan was made on another model than this one ({shown or 'other sites'}); apply "
                            f"it to the model it was planned on ({self.model}), or plan again on this one")

    def retime(self, model: nn.Module, tokenizer: Any, repeats: int = 15, task: Task | None = None,
               progress: bool | None = None) -> None:
        """Measure every point's latency again beside the unedited ``model`` (e.g. on an idle machine), then
        recompute the budget fits, the front and the recommended point. Scores are not re-measured. Each point
        is applied in place (``edits.edited``) and timed in rounds bracketed by forwards of the unedited model
        (the original modules swapped back in), so at most one edited copy of the attention modules exists at a
        time; the model is restored exactly afterwards."""
        task = task or self.make_task()
        device = next(model.parameters()).device
        size = self.settings["timing_batch"][0]
        timing = task.calibration_inputs(tokenizer, limit=size, batch_size=size, device=device)[0]
        edits = [p for p in self.points if p.kind != "base"]
        bar = dict(unit="edit", disable=None if progress is None else not progress)
        calibration = None
        times = {}
        for p in progress_bar(edits, desc="re-time", **bar):
            if p.edit.needs_calibration() and calibration is None:
                calibration = self.calibration(tokenizer, task, device)
            with edited(model, p.edit, calibration if p.edit.needs_calibration() else None) as state:
                times[p.name] = measure_latency(_through(lambda: nullcontext(model)), _through(state.original),
                                                   timing, repeats)
        base_ms = measure_latency(_through(lambda: nullcontext(model)), _through(lambda: nullcontext(model)), timing,
                                  repeats)[1]
        for p in self.points:
            p.measured["latency"], p.measured["latency_ms"] = times.get(p.name, (1.0, base_ms))
        self.settings["latency_repeats"] = repeats
        self.recommended = _finish(self.points, Budget.parse(self.budget), self.base, self.sign)

    # ---- files ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "model": self.model, "task": self.task, "budget": self.budget,
                "settings": self.settings, "recommended": self.recommended, "command": self.command(),
                "front": [p.name for p in self.frontier], "skipped": self.skipped, "proxies": self.proxies,
                "layers": self.layers, "fingerprint": self.fingerprint, "points": [p.to_dict() for p in self.points]}

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        atomic_write_text(path, json_text(self.to_dict(), str(path), indent=1))
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        """A plan from its plan.json document; a wrong shape is refused with one line naming the field."""
        if not isinstance(d, dict):
            raise HeadwiseError(f"the plan is a JSON {type(d).__name__}, not an object; pass the plan.json written by "
                                "headwise plan")
        if d.get("schema") == "headwise.plan/1":
            raise HeadwiseError(f"this plan is format 1 (headwise.plan/1, its edits five fixed fields); this "
                                f"headwise reads {SCHEMA} (edits of method records): re-run headwise plan")
        if d.get("schema") != SCHEMA:
            raise HeadwiseError(f"plan schema {d.get('schema')!r} is not {SCHEMA!r}; re-run headwise plan")
        for key, kind in (("model", str), ("task", dict), ("budget", dict), ("settings", dict), ("points", list),
                          ("proxies", dict), ("layers", dict)):
            if not isinstance(d.get(key), kind):
                raise HeadwiseError(f"the plan's {key!r} is {'missing' if key not in d else type(d[key]).__name__}, "
                                    f"not a {'list' if kind is list else 'mapping' if kind is dict else 'string'};"
                                    " re-run headwise plan")
        task = d["task"]
        if not (isinstance(task.get("name"), str) and isinstance(task.get("options"), dict)
                and isinstance(task.get("metric"), str) and isinstance(task.get("higher_is_better"), bool)):
            raise HeadwiseError("the plan's task needs a name, options, a metric and higher_is_better; re-run "
                                "headwise plan")
        points = [Point.from_dict(p) for p in d["points"]]
        if [p.kind for p in points].count("base") != 1:
            raise HeadwiseError("the plan needs exactly one point of kind 'base' (the unedited model); re-run "
                                "headwise plan")
        recommended = d.get("recommended")
        if recommended is not None and recommended not in [p.name for p in points]:  # a list: no hashing
            raise HeadwiseError(f"the plan recommends {recommended!r}, which is none of its points; re-run "
                                "headwise plan")
        found = d.get("fingerprint")
        if found is not None and not (isinstance(found, dict) and isinstance(found.get("hash"), str)
                                      and isinstance(found.get("sites"), dict)):
            raise HeadwiseError("the plan's fingerprint must be {\"hash\": str, \"sites\": {...}}; re-run headwise "
                                "plan")
        return cls(model=d["model"], task=task, budget=d["budget"], settings=d["settings"], points=points,
                   proxies=d["proxies"], layers=d["layers"], recommended=recommended, skipped=d.get("skipped") or {},
                   fingerprint=found)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        path = Path(path)
        if not path.is_file():
            raise HeadwiseError(f"{path} is not a file; pass the plan.json written by headwise plan")
        try:
            data = json.loads(read_text(path))
        except json.JSONDecodeError as err:
            raise HeadwiseError(f"{path} is not JSON ({err.msg} at line {err.lineno}); pass a plan.json") from None
        except RecursionError:
            raise HeadwiseError(f"{path} is nested too deeply to be a plan.json; pass a plan.json") from None
        try:
            return cls.from_dict(data)
        except HeadwiseError as err:
            raise HeadwiseError(f"{path}: {err}") from None


def fingerprint(model: nn.Module) -> dict[str, Any]:
    """What a plan is bound to: per attention site its layers, current query and key/value heads, head width and
    hidden size (``sites``), and ``hash``, the first 16 hex digits of their SHA-256."""
    sites = {s.name: {"layers": list(s.layers), "heads": s.num_heads, "kv_heads": s.num_kv_heads,
                      "head_dim": s.head_dim, "hidden_size": s.hidden_size} for s in find_sites(model)}
    digest = hashlib.sha256(json.dumps(sites, sort_keys=True).encode()).hexdigest()[:16]
    return {"hash": digest, "sites": sites}


def fingerprint_differences(planned: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Readable differences between two fingerprints' ``sites`` (``enc-self.0 heads: planned 12, model 11``)."""
    out = [f"{name} {key}: planned {spec.get(key)}, model {now[name].get(key)}"
           for name, spec in planned.items() if name in now and isinstance(spec, dict)
           for key in sorted(set(spec) | set(now[name])) if spec.get(key) != now[name].get(key)]
    out += [f"site {name} planned, not in the model" for name in planned if name not in now]
    out += [f"site {name} in the model, not planned" for name in now if name not in planned]
    return out


def task_spec(task: Task) -> dict[str, Any]:
    options = {f.name: getattr(task, f.name) for f in fields(task) if getattr(task, f.name) is not None}
    return {"name": task.name, "options": options, "metric": task.metric, "higher_is_better": task.higher_is_better}


def recover_model(model: nn.Module, tokenizer: Any, task: Task, pristine: nn.Module | None, mode: str,
                  epochs: float) -> None:
    """``headwise.recover`` (the tasks layer's recovery) with ``pristine`` (the unedited model) as the teacher,
    or nothing for ``mode="none"``."""
    if mode == "none":
        return
    recover(model, tokenizer, task, teacher=pristine, mode=mode, epochs=epochs, progress=False)


def _through(enter: Callable[[], ContextManager[nn.Module]]) -> Callable[[], ContextManager[nn.Module]]:
    """What ``measure_latency`` times: the model ``enter()`` yields, its forwards through the methods it carries
    (``contract.measured``)."""
    @contextmanager
    def timed() -> Iterator[nn.Module]:
        with enter() as model, measured(model):
            yield model

    return timed


def calibration_set(task: Task, tokenizer: Any, count: int, uncapped: bool = False,
                    device: torch.device | str = "cpu") -> list[dict]:
    """A plan's calibration batches: the first ``count`` examples of the task's calibration split (``uncapped``:
    of its whole text, past the task's ``max_tokens``, which caps what is evaluated: the stream is cut where
    ``count`` windows of ``max_length`` tokens end, so only that prefix of the text is tokenised)."""
    source = replace(task, max_tokens=max(task.max_tokens, count * task.max_length)) if uncapped else task
    return source.calibration_inputs(tokenizer, limit=count, batch_size=min(16, count), device=device)


def _tokens(batches: Sequence[dict]) -> int:
    """Real tokens in calibration batches."""
    return sum(int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel() for b in batches)


@dataclass
class Calibration:
    """The calibration a plan measures with: ``batches`` of ``count`` examples (``uncapped``: past the task's
    ``max_tokens``) holding ``tokens`` real tokens."""

    batches: list[dict]
    count: int
    uncapped: bool
    tokens: int


def settle_calibration(model: nn.Module, tokenizer: Any, task: Task, count: int, tried: list[Method],
                       explicit: bool) -> tuple[Calibration, dict[str, str]]:
    """The plan's calibration, settled before any work: ``count`` examples of the task's calibration split; where
    they hold fewer tokens than a calibrated method's fit needs (its ``calibration_tokens`` hook), more examples of
    that split, past ``max_tokens`` if the text holds more (a ``HeadwiseNote`` says so). A method whose need the
    data cannot meet is refused when it was asked for by name (``explicit``), else skipped; returns the
    calibration and ``{method: why it is skipped}``."""
    device = next(model.parameters()).device
    needs = {m.name: int(m.calibration_tokens(model)) for m in tried
             if m.planned.calibrated and m.calibration_tokens is not None}
    need = max(needs.values(), default=0)
    batches = calibration_set(task, tokenizer, count, False, device)
    found = Calibration(batches, count, False, _tokens(batches))
    first = found.tokens
    if first < need:
        for uncapped in (False, True) if getattr(task, "max_tokens", None) is not None else (False,):
            n = count
            while found.tokens < need:
                batches = calibration_set(task, tokenizer, n, uncapped, device)
                held, examples = _tokens(batches), sum(len(b["input_ids"]) for b in batches)
                if held > found.tokens:
                    found = Calibration(batches, n, uncapped, held)
                if examples < n:  # the split holds no more
                    break
                n = max(n + 1, math.ceil(n * need / max(held, 1)))
        if found.count != count:
            wanting = ", ".join(name for name, n in needs.items() if n > first)
            warnings.warn(f"{count} calibration examples hold {first} tokens, fewer than {wanting} need ({need}, the "
                          f"hidden size); calibrating on {found.count} examples"
                          + (" of the whole text (past max_tokens, which caps the evaluation)" if found.uncapped
                             else "") + f": {found.tokens} tokens", HeadwiseNote, stacklevel=3)
    short = {name: n for name, n in needs.items() if n > found.tokens}
    where = f"{found.count} examples{' of its whole text' if found.uncapped else ''}"
    if short and explicit:
        name, n = next(iter(short.items()))
        raise HeadwiseError(f"{name} fits on calibration data and needs at least {n} tokens (the model's hidden "
                            f"size); the task's calibration data holds {found.tokens} ({where}): give more text "
                            f"(--data), or leave {name} out of the methods")
    skipped = {name: f"its fit needs {n} calibration tokens (the hidden size) and the task's calibration data "
                     f"holds {found.tokens} ({where}); give more text to try it" for name, n in short.items()}
    if skipped:
        warnings.warn("not trying " + "; ".join(f"{name}: {why}" for name, why in skipped.items()), HeadwiseNote,
                      stacklevel=3)
    return found, skipped


class Bench:
    """The model a plan measures edits on, with what every measurement shares: the calibration batches, the
    timing batch, the probe (the first four calibration examples) and its unedited outputs, and, when ``recover``
    trains every weight, one pristine copy (the recovery teacher and what the weights are restored from: the only
    copy of the model a plan makes). Every score, output and latency is measured with the model's forwards through
    the methods it carries (``contract.measured``: e.g. a KV policy's cache)."""

    def __init__(self, model: nn.Module, tokenizer: Any, task: Task, calibration: list[dict], repeats: int,
                 recover: str, recover_epochs: float) -> None:
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.repeats, self.recover, self.recover_epochs = repeats, recover, recover_epochs
        device = next(model.parameters()).device
        self.calibration = calibration
        shape_size = getattr(task, "batch_size", None) or 1
        self.timing = task.calibration_inputs(tokenizer, limit=shape_size, batch_size=shape_size, device=device)[0]
        self.length = sequence_length(self.calibration)
        self.probe = [{k: v[:4] for k, v in self.calibration[0].items()}]
        with measured(model):
            self.reference = outputs(model, self.probe)
        self.pristine = copy.deepcopy(model) if recover != "none" else None

    def base(self) -> Point:
        """The unedited model's point."""
        with measured(self.model):
            metrics = self.task.evaluate(self.model, self.tokenizer, progress=False)
        costs = static_costs(self.model, self.length)
        model = _through(lambda: nullcontext(self.model))
        costs.latency, costs.latency_ms = measure_latency(model, model, self.timing, self.repeats)
        costs.latency = 1.0
        return Point("base", "base", [], Edit(), {"score": float(metrics[self.task.metric]),
                                                  "metrics": _plain(metrics), **costs.to_dict()})

    def probe_error(self, configs: Sequence[Any]) -> float:
        """The relative output error on the probe of ``configs`` applied in place (the model restored after)."""
        with edited(self.model, Edit(tuple(configs)), self.calibration), measured(self.model):
            return relative_error(self.reference, outputs(self.model, self.probe))

    def measure(self, edit: Edit) -> tuple[float, dict[str, Any]]:
        """``(output error on the probe, measured score and costs)`` of ``edit``, applied in place; the model is
        restored exactly afterwards; ``seconds``: what measuring it cost (edit, evaluation, timing)."""
        start = time.perf_counter()
        model, task = self.model, self.task
        with edited(model, edit, self.calibration if edit.needs_calibration() else None) as state:
            try:
                with measured(model):
                    proxy = relative_error(self.reference, outputs(model, self.probe))
                recover_model(model, self.tokenizer, task, self.pristine, self.recover, self.recover_epochs)
                with measured(model):
                    metrics = task.evaluate(model, self.tokenizer, progress=False)
                costs = static_costs(model, self.length)
                costs.latency, costs.latency_ms = measure_latency(_through(lambda: nullcontext(model)),
                                                                  _through(state.original), self.timing, self.repeats)
            finally:
                if self.pristine is not None:  # the weights outside the attention modules were trained in place
                    with state.original(), torch.no_grad():
                        model.load_state_dict(self.pristine.state_dict())
        return proxy, {"score": float(metrics[task.metric]), "metrics": _plain(metrics), **costs.to_dict(),
                       "seconds": time.perf_counter() - start}


def plan(model: nn.Module, tokenizer: Any, task: Task | str, budget: Budget | str | dict, *,
         ranking: str = "gradient", examples: int = 256, top_k: int = 3, repeats: int = 7, calibration: int = 64,
         recover: str = "none", recover_epochs: float = 1.0, allow_empty_layers: bool = False,
         methods: Sequence[str] | None = None, model_name: str | None = None,
         progress: bool | None = None, importance_batch: int = 8) -> Plan:
    """Search edits of ``model`` (unchanged) for ``task`` under ``budget`` and measure them; see the module
    docstring. ``methods`` restricts the methods tried (registered planned methods, by name; a former name warns;
    default: all of them, ``candidates.plannable``); ``ranking``: how the method of role ``"heads"`` orders heads
    (one of its declared ``rankings``; ``examples`` training examples, ``importance_batch`` per backward: lower
    it to lower the plan's peak memory); ``calibration``: calibration examples (more when a calibrated method
    needs more tokens, ``settle_calibration``); ``recover`` recovers every measured edit first (costly);
    ``repeats``: latency repeats per point."""
    task = get_task(task) if isinstance(task, str) else task
    budget = Budget.parse(budget)
    tried = plannable(methods)
    _check(model, tokenizer, task, budget, tried, ranking, recover, allow_empty_layers,
           top_k=top_k, repeats=repeats, calibration=calibration, examples=examples, importance_batch=importance_batch)
    model.eval()
    settled, short = settle_calibration(model, tokenizer, task, calibration, tried, explicit=methods is not None)
    tried = [m for m in tried if m.name not in short]
    bench = Bench(model, tokenizer, task, settled.batches, repeats, recover, recover_epochs)
    base = bench.base()
    context = PlanContext([], budget.head_count(base.measured["heads"]), bench.length, allow_empty_layers,
                          bench.probe_error, progress, task, tokenizer, ranking, examples, importance_batch,
                          budget.to_dict(), finetune)
    ranked = rank_heads(model, context, tried)
    found = candidates(model, replace(context, removal_order=ranked.order), tried, recover)
    skipped = short | found.skipped
    singles = measure_singles(bench, found.singles, skipped, progress)
    sign = 1.0 if task.higher_is_better else -1.0
    combined = measure_combined(bench, found.singles, singles, base, budget, sign, top_k, skipped, progress)
    points = [base, *singles, *combined]
    settings = {"ranking": ranking if ranked.scores else None, "importance_examples": examples,
                "importance_batch": importance_batch, "top_k": top_k, "latency_repeats": repeats,
                "calibration": settled.count, "calibration_uncapped": settled.uncapped,
                "calibration_tokens": settled.tokens, "recover": recover, "recover_epochs": recover_epochs,
                "allow_empty_layers": allow_empty_layers, "sequence_length": bench.length,
                "timing_batch": list(bench.timing["input_ids"].shape), "device": str(next(model.parameters()).device),
                "evaluated_on": _subsample(task), "methods": [m.name for m in tried]}
    return Plan(model=model_name or getattr(model, "name_or_path", "") or type(model).__name__, task=task_spec(task),
                budget=budget.to_dict(), settings=settings, points=points,
                proxies={"head_scores": ranked.scores, "removal_order": ranked.order,
                         "site_proxies": found.site_proxies},
                layers=_layers(model, ranked.scores, found.site_proxies),
                recommended=_finish(points, budget, base, sign), skipped=skipped, fingerprint=fingerprint(model))


def _check(model: nn.Module, tokenizer: Any, task: Task, budget: Budget, tried: list[Method], ranking: str,
           recover: str, allow_empty_layers: bool, **counts: int) -> None:
    """Refuse bad settings, a budget the model cannot meet and a ranking the head-removal method does not take,
    before any work."""
    if recover not in MODES:
        raise HeadwiseError(f"recover={recover!r}; use one of {', '.join(MODES)}")
    small = [name for name, value in counts.items() if value < 1]
    if small:
        raise HeadwiseError(f"{', '.join(small)} must be ≥ 1 (got {', '.join(str(counts[n]) for n in small)})")
    for method in tried:
        if method.planned.role == "heads" and ranking not in method.planned.rankings:
            raise HeadwiseError(f"unknown head ranking {ranking!r}; {method.name} ranks heads by "
                                f"{', '.join(method.planned.rankings)}")
    budget.validate(model, allow_empty_layers)
    task.check_model(model, tokenizer)


def rank_heads(model: nn.Module, context: PlanContext, tried: list[Method]) -> Ranking:
    """The head order of the first tried method of role ``"heads"`` (its ``rank`` hook); no ranking (and no cost)
    when none is tried."""
    heads = next((m for m in tried if m.planned.role == "heads"), None)
    return Ranking({}, []) if heads is None else heads.rank(model, context)


def measure_singles(bench: Bench, singles: list[Candidate], skipped: dict[str, str],
                    progress: bool | None) -> list[Point]:
    """Every single-method candidate, measured; one that fails is skipped with its reason."""
    points = []
    bar = progress_bar(singles, desc="measure single methods", unit="edit",
                       disable=None if progress is None else not progress)
    for cand in bar:
        try:
            cand.proxy, measured = bench.measure(cand.edit)
        except HeadwiseError as err:
            skipped.setdefault(cand.method.name, f"{cand.name}: {err}")
            bar.set_postfix_str(f"last {cand.name} skipped", refresh=False)
            continue
        bar.set_postfix_str(f"last {cand.name} {measured['seconds']:.0f}s", refresh=False)  # which edits cost
        points.append(Point(cand.name, "single", list(cand.edit.methods), cand.edit, measured, proxy=cand.proxy))
    return points


def measure_combined(bench: Bench, candidates: list[Candidate], singles: list[Point], base: Point, budget: Budget,
                     sign: float, top_k: int, skipped: dict[str, str], progress: bool | None) -> list[Point]:
    """Heads removed × a method of role ``"pair"``: predicted from the measured singles, then the best inside the
    budget (and each head-removal level's best and cheapest pair) measured (``search.finalists``)."""
    by_name = {c.name: c for c in candidates}
    measured = [(by_name[p.name], p.measured) for p in singles]
    prunes = [(c, m) for c, m in measured if c.method.planned.role == "heads"]
    others = [(c, m) for c, m in measured if c.method.planned.role == "pair"]
    points = []
    chosen = finalists(prunes, others, base.measured, budget, sign, top_k)
    bar = progress_bar(chosen, desc="measure combined plans", unit="edit",
                       disable=None if progress is None else not progress)
    for name, parts, edit, pred in bar:
        try:
            result = bench.measure(edit)[1]
        except HeadwiseError as err:
            skipped.setdefault("combined", f"{name}: {err}")
            bar.set_postfix_str(f"last {name} skipped", refresh=False)
            continue
        bar.set_postfix_str(f"last {name} {result['seconds']:.0f}s", refresh=False)
        points.append(Point(name, "combined", list(edit.methods), edit, result, predicted=pred, parts=parts))
    return points


def _finish(points: list[Point], budget: Budget, base: Point, sign: float) -> str | None:
    """Mark budget fits and the front; return the recommended point's name."""
    for p in points:
        p.meets_budget = budget.met_by(p.measured, base.measured)
        p.on_front = False
    vectors = [[-sign * p.measured["score"]] + [_objective(p.measured.get(key)) for key in COST_KEYS] for p in points]
    for i in front(vectors):
        points[i].on_front = True
    fitting = [p for p in points if p.meets_budget and p.kind != "base"]
    if not fitting:
        return None
    return max(fitting, key=lambda p: sign * p.measured["score"]).name


def _objective(value: float | None) -> float:
    """A cost as a Pareto objective: a cost not counted (None) is no better than any other."""
    return math.inf if value is None else float(value)


def _layers(model: nn.Module, scores: dict[str, list[float]], site_proxies: dict[str, dict[str, float]]
            ) -> dict[str, Any]:
    """Per site: heads, key/value heads, importance per head, and each sweep's per-site proxy (``{label: value}``)."""
    return {s.name: {"heads": s.num_heads, "kv_heads": s.num_kv_heads, "importance": scores.get(s.name),
                     "proxies": {label: values[s.name] for label, values in site_proxies.items() if s.name in values}}
            for s in find_sites(model)}


def _subsample(task: Task) -> str:
    limit, tokens = getattr(task, "limit", None), getattr(task, "max_tokens", None)
    if limit:
        return f"first {limit} examples of the {task.split} split"
    if tokens:
        return f"first {tokens} tokens of the {task.split} split"
    return f"the whole {task.split} split"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, float) else v) for k, v in metrics.items()}
