"""The KV-policy experiment (``headwise kv-policy``) as one function: score the KV heads of a decoder-only LM, keep
full the ones that need it and stream the rest so that the cache fits the budget, then measure what that gives at
the context length (KV bytes held, peak memory and decode speed through ``generate()``), verify the policy against
the full cache and measure the ``lm`` task's perplexity through both.

>>> run = kv_policy_experiment(model, tokenizer, task, KVPolicySettings(kv_budget=0.5, context=2048))
>>> run.policy, run.scores, run.summary["verdict"]

The verification is a seam: ``verify`` is any ``Verification``: ``SuiteCheck`` (the long-context suite's small
subset, what ``headwise kv-policy`` runs by default) or ``PasskeyCheck`` (passkey retrieval on a prompt family other
than the calibration's).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from torch import nn

from ..errors import HeadwiseError
from ..kvcache import KVGateConfig, KVPolicy, ScoreConfig, apply_kv_policy, kv_policy, remove_kv_policy
from ..kvcache.choose import (DEFAULT_RANKING, calibration_length, default_window, full_heads_for_budget, needs_text,
                               text_length)
from ..kvcache.natural import CALIBRATION_SOURCES, natural_texts
from ..kvcache.policy import model_shape
from ..kvcache.measure import measure_policy
from ..kvcache.passkey import PromptFamily, family_prompts, passkey_accuracy
from ..kvcache.scores import HeadScores
from ..tasks import Task

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # where the passkey check hides its keys


@dataclass
class KVPolicySettings:
    """What ``kv_policy_experiment`` does. The budget: ``kv_budget`` of the full cache at ``context`` tokens, streaming
    heads keeping ``sink`` + ``window`` tokens (None: ``kvcache.choose.default_window``), the window scaled with the
    sequence unless ``fixed_window``. The ranking: ``ranking`` of the training-free scores on ``calibration_families``
    prompts of ``calibration_length`` tokens (None: ``kvcache.choose.calibration_length``; ``ranking`` None:
    ``kvcache.choose.DEFAULT_RANKING``), or, with ``gates``, learned gates (``ranking`` is then ``"learned"``); a
    ranking that reads ``outside`` measures it on ``kvcache.natural``'s texts (Python's documentation and source,
    never the check's prose) and, with ``data_calibration``, on the task's text (the user's ``--data``) too. The
    measurements: ``measure`` (through ``generate()``, a prompt of ``context`` tokens of ``eval_family`` (None: ``text``
    from the task's evaluated part) + ``measure_new``, ``measure_repeats`` times, prefill in chunks of ``prefill_chunk``
    tokens: ``"auto"``, a number, or None for the whole prompt) and ``perplexity`` (of the task, through the policy and
    the full cache). ``seed``: of the prompts."""

    kv_budget: float = 0.5
    context: int = 2048
    sink: int = 4
    window: int | None = None
    fixed_window: bool = False
    ranking: str | None = None
    gates: KVGateConfig | None = None
    calibration_length: int | None = None
    calibration_families: tuple[str, ...] = ("filler",)
    data_calibration: bool = False
    seed: int = 0
    eval_family: str | None = None
    measure: bool = True
    measure_new: int = 32
    measure_repeats: int = 1
    prefill_chunk: int | str | None = "auto"
    perplexity: bool = True

    def __post_init__(self) -> None:
        if self.window is None:
            self.window = default_window(self.kv_budget, self.context, self.sink)
        self.calibration_families = tuple(PromptFamily.parse(name.strip()).name
                                          for name in self.calibration_families)
        if self.gates is not None and self.ranking not in (None, "learned"):
            raise HeadwiseError(f"--scores learned ranks by the learned gates; drop --kv-ranking {self.ranking}")
        self.ranking = "learned" if self.gates is not None else self.ranking or DEFAULT_RANKING
        if self.measure and (self.measure_new < 2 or self.measure_repeats < 1):
            raise HeadwiseError(f"measure_new {self.measure_new} / measure_repeats {self.measure_repeats}: decode "
                                "speed needs at least 2 new tokens and 1 repeat (or no measurement)")


class Verification(Protocol):
    """A check of the chosen policy against the full cache: ``run`` returns its result (a JSON mapping, stored in
    the summary under ``name``; empty when it did not run), ``line`` says it in the verdict. The seam the
    long-context suite fills (``kv_policy_experiment(..., verify=...)``)."""

    name: str

    def run(self, model: nn.Module, tokenizer: Any, policy: KVPolicy, prefill_chunk: int | str | None
            ) -> dict[str, Any]: ...

    def line(self, result: dict[str, Any]) -> str: ...


@dataclass
class PasskeyCheck:
    """Passkey retrieval with the full cache and with the policy: ``keys`` keys at each of five depths in prompts
    of ``length`` tokens of ``family`` (``text`` for the ``text`` family: running text the calibration never saw).
    ``keys=0``: skipped."""

    family: str
    length: int
    keys: int = 1
    seed: int = 0
    text: str | None = None
    name: str = "passkey_check"

    def run(self, model: nn.Module, tokenizer: Any, policy: KVPolicy, prefill_chunk: int | str | None
            ) -> dict[str, Any]:
        if self.keys < 1:
            return {}
        prompts = family_prompts(tokenizer, PromptFamily.parse(self.family), self.length, list(DEPTHS), self.keys,
                                 self.seed + 1000, self.text)
        check: dict[str, Any] = {}
        for name, rules in (("full", KVPolicy.uniform(model)), ("policy", policy)):
            apply_kv_policy(model, rules, prefill_chunk=prefill_chunk)
            check[name] = passkey_accuracy(model, tokenizer, prompts)
        remove_kv_policy(model)
        return check | {"family": PromptFamily.parse(self.family).name,
                        "length": int(max(len(p.ids) for p in prompts))}

    def line(self, result: dict[str, Any]) -> str:
        if not result:
            return "passkey not measured (--no-measure or --eval-keys 0)"
        return (f"passkey ({result['family']} prompts, up to {result['length']} tokens): "
                f"{result['policy']['correct']}/{result['policy']['prompts']} with the policy vs "
                f"{result['full']['correct']}/{result['full']['prompts']} with the full cache")


@dataclass
class SuiteCheck:
    """The long-context suite's small subset with the full cache and through the policy on the same samples
    (``tasks.long.verify_policy``: retrieval with distractors and several values, and facts placed in the text;
    ``samples`` per task at ``length`` tokens), on ``haystack`` (natural prose by default: a text no calibration
    prompt is made of) and on the user's ``data`` file when given. Its samples come from the suite's own seed and
    needle formats, never from the calibration's passkeys and fact lookups. ``samples=0``: skipped. The verdict
    gives the retention (policy / full) on each haystack and flags one below ``tasks.long.RETENTION_FLOOR``."""

    length: int
    samples: int = 4
    haystack: str = "prose"
    data: str | None = None
    name: str = "long_check"

    def __post_init__(self) -> None:
        from ..tasks.haystacks import Haystack
        from ..tasks.long_data import MIN_LENGTH

        if self.samples > 0 and self.length < MIN_LENGTH:
            raise HeadwiseError(f"the long-context check runs at the policy's length, {self.length} tokens, below the "
                                f"suite's shortest prompt ({MIN_LENGTH}): raise --context or use --check passkey")
        for name, option in ((self.haystack, "--haystack"), (self.data, "--data")):
            if name is not None:
                Haystack.of(name, option)  # a missing file fails before the model loads

    @property
    def haystacks(self) -> tuple[str, ...]:
        """The haystacks the check runs on."""
        return (self.haystack,) + ((self.data,) if self.data is not None and self.data != self.haystack else ())

    def run(self, model: nn.Module, tokenizer: Any, policy: KVPolicy, prefill_chunk: int | str | None
            ) -> dict[str, Any]:
        from ..tasks.long import verify_policy

        if self.samples < 1:
            return {}
        return verify_policy(model, tokenizer, policy, length=self.length, samples=self.samples,
                             haystack=self.haystack, data=self.data)

    def line(self, result: dict[str, Any]) -> str:
        from ..tasks.long import RETENTION_FLOOR

        if not result:
            return "long-context check not run (--no-measure, or samples=0)"
        counts = {t: sum(per.values()) for t, per in result["policy"]["samples"].items()}
        parts = []
        for name, r in result["haystacks"].items():
            full, policy, diff, kept = r["full"], r["policy"], r["difference"], r["retention"]
            flag = ("" if kept is None or kept >= RETENTION_FLOOR else
                    f" — BELOW {RETENTION_FLOOR:g}: the policy loses on this text; try a larger --kv-budget")
            parts.append(f"on {name}: {policy['score']:.1f} with the policy vs {full['score']:.1f} with the full cache, "
                         f"retention {'—' if kept is None else f'{kept:.2f}'}{flag} (policy − full "
                         f"{diff['difference']:+.1f}, 95% interval {diff['ci'][0]:+.1f} to {diff['ci'][1]:+.1f}, "
                         f"{diff['samples']} samples)")
        return (f"long-context check ({', '.join(f'{t} ×{n}' for t, n in counts.items())} per haystack at "
                f"{self.length} tokens, seed {self.seed_of(result)}): " + "; ".join(parts))

    @staticmethod
    def seed_of(result: dict[str, Any]) -> int:
        drawn = result["drawn_from"]
        return next(iter(drawn["haystacks"].values()))["seed"] if "haystacks" in drawn else drawn["seed"]


@dataclass
class KVPolicyRun:
    """What ``kv_policy_experiment`` found: the ``policy``, the head ``scores`` and the ``summary`` (verdict
    first: what ``headwise kv-policy`` writes to summary.json)."""

    policy: KVPolicy
    scores: HeadScores
    summary: dict[str, Any] = field(default_factory=dict)
    calibrated_on: str = ""  # what the ranking read, in words


def eval_text(task: Task) -> str:
    """The task's evaluated part (its last 10%) as one text: the haystack of the ``text`` prompt family."""
    return "\n".join(line for line in task.texts("eval") if line.strip())


def calibration_texts(task: Task, count: int = 4) -> list[str]:
    """The task's calibration part (the first 90% of the text) in ``count`` contiguous passages of equal length."""
    text = "\n".join(line.strip() for line in task.texts("calibration") if line.strip())
    size = -(-len(text) // count)
    return [p for p in (text[i * size:(i + 1) * size] for i in range(count)) if p]


def outside_texts(tokenizer: Any, task: Task, settings: KVPolicySettings, has_text: bool, length: int
                  ) -> tuple[list[str], str]:
    """The texts ``outside`` is measured on (``kvcache.natural``'s, and with ``settings.data_calibration`` the
    task's calibration passages, each at least ``length`` tokens) and where they come from, in words."""
    texts = natural_texts(tokenizer, length, seed=settings.seed)
    where = f"{len(texts)} passages of {length} tokens of Python's {' and '.join(CALIBRATION_SOURCES)}"
    if settings.data_calibration and has_text:
        data = calibration_texts(task)
        short = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in data]
        if min(short) <= settings.sink + settings.window + 1:
            raise HeadwiseError(f"--data {task.source()}: its first 90% makes {len(data)} calibration passages of "
                                f"{min(short)} to {max(short)} tokens, which a sink {settings.sink} + window "
                                f"{settings.window} head drops nothing of; give a longer text (at least "
                                f"{4 * (settings.sink + settings.window + 2)} tokens) or a smaller --window")
        texts, where = data + texts, f"{len(data)} passages of {task.source()} + " + where
    return texts, where


def perplexities(model: nn.Module, tokenizer: Any, task: Task, policy: KVPolicy) -> dict[str, Any]:
    """The task's perplexity with the full cache and through ``policy`` (every window one prefill through it)."""
    from ..kvcache import policy_forward

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


def _scores(model: nn.Module, tokenizer: Any, task: Task, settings: KVPolicySettings, has_text: bool
            ) -> tuple[KVPolicy, HeadScores, ScoreConfig, str]:
    """The policy, the scores it was chosen by (learned gates trained first when asked), their config and where the
    ``outside`` texts came from ("" when the ranking reads none)."""
    texts = calibration_texts(task) if has_text else None
    if settings.gates is not None and settings.gates.haystack == "text":  # the gates' haystack: the calibration part
        texts = [line for line in task.texts("calibration") if line.strip()]
    length = settings.calibration_length or calibration_length(settings.ranking, settings.sink, settings.window)
    config = ScoreConfig(length=length, sink=settings.sink, window=settings.window, seed=settings.seed,
                         families=settings.calibration_families,
                         text_length=settings.calibration_length or text_length(settings.sink, settings.window))
    where = ""
    if settings.gates is None and needs_text(settings.ranking):
        texts, where = outside_texts(tokenizer, task, settings, has_text, config.text_length)
    learned = None
    if settings.gates is not None:  # through the shared Trainer (data-parallel under torchrun), then ranked like any
        from ..sites import find_sites
        from ..training import train_kv_gates

        heads = next(site for site in find_sites(model) if site.kind == "dec-self").num_heads
        learned = train_kv_gates(model, tokenizer, settings.gates, texts=texts).scores(heads)
    policy, scores = kv_policy(model, tokenizer, settings.kv_budget, settings.context, settings.sink, settings.window,
                               settings.ranking, texts=texts, config=config, scores=learned,
                               scaled=not settings.fixed_window)
    return policy, scores, config, where


def kv_policy_experiment(model: nn.Module, tokenizer: Any, task: Task, settings: KVPolicySettings, *,
                         has_text: bool = True, verify: Verification | None = None, out: str = "headwise-kv-policy"
                         ) -> KVPolicyRun:
    """Choose a KV policy for ``model`` under ``settings`` and measure it (see the module docstring). ``task``: the
    ``lm`` task whose text (when ``has_text``) calibrates the rankings that read text, makes the measured prompt
    of the ``text`` family and gives the perplexity (``task.source()`` names it); ``verify``: the check against
    the full cache (None: none); ``out``: where the policy will be saved (named in the verdict's ``use`` line).
    Nothing is written."""
    if task.name != "lm":
        raise HeadwiseError(f"the KV-policy experiment measures a decoder-only KV cache, on the lm task only (got "
                            f"{task.name})")
    tokenizer.model_max_length = getattr(model.config, "max_position_embeddings", tokenizer.model_max_length)
    full_heads_for_budget(sum(model_shape(model)), settings.kv_budget, settings.context, settings.sink,
                          settings.window, not settings.fixed_window)  # fail before work
    policy, scores, config, outside = _scores(model, tokenizer, task, settings, has_text)
    prefill_chunk = settings.prefill_chunk or None  # 0: the whole prompt
    measured = None
    if settings.measure:
        family = PromptFamily.parse(settings.eval_family or "text")
        measure_ids = family_prompts(tokenizer, family, settings.context, [0.5], 1, settings.seed + 1000,
                                     eval_text(task) if has_text else None)[0].ids
        measured = measure_policy(model, measure_ids, policy, settings.measure_new, settings.measure_repeats,
                                  pad_token_id=tokenizer.eos_token_id, prefill_chunk=prefill_chunk)
    check = verify.run(model, tokenizer, policy, prefill_chunk) if verify is not None and settings.measure else {}
    ppl = perplexities(model, tokenizer, task, policy) if settings.perplexity and has_text else None
    fraction = policy.kv_fraction(settings.context)
    verdict = {
        "memory": f"KV cache at {settings.context} tokens: {fraction:.0%} of the full cache "
                  f"({1 - fraction:.0%} saved); {policy.describe()}",
        "measured": measured_line(measured),
        "quality": (verify.line(check) if verify is not None else "no verification of the policy")
                   + (f"; perplexity {ppl['policy']['perplexity']:.2f} through the policy vs "
                      f"{ppl['full']['perplexity']:.2f} with the full cache ({ppl['policy']['tokens']:,} tokens of "
                      f"{task.source()}, {task.max_length}-token windows)" if ppl else ""),
        "use": f"headwise.apply_kv_policy(model, '{out}/policy.json', prefill_chunk={prefill_chunk!r}); "
               "then model.generate(...)",
    }
    summary = {"verdict": verdict, "kv_budget": settings.kv_budget, "context": settings.context,
               "kv_fraction": fraction, "kv_fraction_at": {str(n): share for n, share in policy.savings().items()},
               "prefill_chunk": prefill_chunk, "sink": settings.sink, "window": settings.window,
               "ranking": settings.ranking, "scores": "learned" if settings.gates is not None else "training-free",
               "gates": None if settings.gates is None else asdict(settings.gates),
               "full_heads": [list(p) for p in policy.full_heads()], "calibration": scores.counts,
               "calibration_families": list(config.families), "measured": measured,
               (verify.name if verify is not None else "verification"): check, "perplexity": ppl}
    gates, ranking = settings.gates, settings.ranking
    calibrated_on = (f"learned gates (haystack {gates.haystack})" if gates is not None else "none (--kv-ranking "
                     "random)" if ranking == "random" else "synthetic passkey and fact-lookup prompts ("
                     f"{', '.join(settings.calibration_families)}) and repeated random tokens"
                     + (f"; 'outside' on {outside}" if outside else ""))
    return KVPolicyRun(policy, scores, summary, calibrated_on)
