"""What a method declares about itself, as light data: the command line, the planner, the docs index
(``headwise methods``) and the layer test read it without importing torch. Walk-through: docs/adding.md.

>>> GQA = Declaration(name="gqa", config=GQAConfig, doc="docs/kv-cache.md",
...                   examples=("headwise edit gqa --model smollm2-135m --kv-heads 1 --out smol-gqa1",),
...                   planned=Planned(order=20, role="pair", calibrated=True, label="merge KV heads"))

A built-in method package lists its declarations in ``declaration.py`` (``DECLARATIONS``); its ``method.py``
binds each to what the method does (``headwise.contract.MethodHooks``, ``@register(GQA)``). What the command line
needs per config field sits on the field (``metadata``): ``help``; ``flag`` when ``--FIELD`` means something else
elsewhere; ``former``, an old spelling kept as a hidden alias; ``positive``, a number that must be above 0.

The planner's side: ``Planned`` (where a method goes in a combined edit, its role, whether it is calibrated or
trains), ``PlanContext`` (what the planner knows when it asks a method for its ``Levels``), ``Ranking`` (the
head order a method of role ``"heads"`` gives) and ``AttentionCost`` (what a method changes at a site that the
cost model cannot read from its shapes).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from .errors import HeadwiseError

Role = Literal["heads", "pair", "alone"]
ROLES: tuple[str, ...] = ("heads", "pair", "alone")
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class Planned:
    """How ``headwise.plan`` tries a method; its hooks ``levels``, ``describe`` (and ``at_site``) give the configs.

    ``order``: where it goes in a combined edit, lower first (built-in: heads removed 10, KV merge 20, latent
    keys/values 25, collaborative 30, replace 40, quantization 50, KV policy 70). ``role``: ``"heads"`` (its levels are the head-removal axis; its
    ``rank`` hook orders the heads, by one of ``rankings``, the first by default), ``"pair"`` (each level is also
    measured on top of the head-removal levels) or ``"alone"``. ``calibrated``: applying it takes calibration
    batches. ``trains``: a level means something only after recovery. ``label``: its name in plots and tables.
    ``former``: names plans gave it before (plan format 1's fields), accepted where plans name methods
    (``plan(methods=...)``, ``--methods``) with a notice, for one release."""

    order: int
    role: Role = "alone"
    calibrated: bool = False
    trains: bool = False
    label: str = ""
    rankings: tuple[str, ...] = ()
    former: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise HeadwiseError(f"planned role {self.role!r}; use one of {', '.join(ROLES)}")
        if (self.role == "heads") != bool(self.rankings):
            raise HeadwiseError("a method of role 'heads' names its head rankings (rankings=('gradient', ...)); "
                                "no other role takes rankings")


def first_sentence(doc: str | None) -> str:
    """A docstring's first sentence as --help shows it: one line, without reStructuredText roles and literals."""
    text = " ".join((doc or "").split())
    text = re.sub(r":\w+:`([^`]+)`", r"\1", text).replace("``", "")
    return text.split(". ")[0].rstrip(".") + "." if text else ""


@dataclass(frozen=True, kw_only=True)
class Declaration:
    """One method, as the tools that do not run it see it.

    ``name``: the registered name (lower case, ``_``); ``config``: its config class (a ``MethodConfig``, in a module
    that imports no torch); ``summary``: one line (default: the config docstring's first sentence); ``examples``:
    ``headwise edit NAME ...`` lines its --help shows (the tests parse each); ``aliases``: former names of the
    method (saved records resolve them; a name typed by a user resolves with a notice, ``contract.method_named``;
    ``headwise edit`` takes them, unlisted); ``version``:
    of its records; ``planned``: how the planner tries it (None: not planned); ``trained_by``: the command that
    trains what it attaches (named when an option that moved to training is given to ``edit``); ``doc``: its
    page (``docs/NAME.md#anchor``; empty: its package's docstring is the documentation)."""

    name: str
    config: type
    summary: str = ""
    examples: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    version: int = 1
    planned: Planned | None = None
    trained_by: str = ""
    doc: str = ""

    def __post_init__(self) -> None:
        bad = [n for n in (self.name, *self.aliases) if not NAME.match(n)]
        if bad:
            raise HeadwiseError(f"method name {bad[0]!r}: use lower-case letters, digits and _ (e.g. 'kv_policy')")
        if not (isinstance(self.config, type) and dataclasses.is_dataclass(self.config)):
            raise HeadwiseError(f"method {self.name!r}: its config must be a dataclass, got {self.config!r}")
        wrong = [e for e in self.examples if not e.startswith(f"headwise edit {self.name} ")]
        if wrong:
            raise HeadwiseError(f"method {self.name!r}: an example is a `headwise edit {self.name} ...` line, got "
                                f"{wrong[0]!r}")
        object.__setattr__(self, "examples", tuple(self.examples))
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "summary", self.summary or first_sentence(self.config.__doc__))


@dataclass
class Levels:
    """A method's answer to the planner: ``configs`` as ``(point name, config)`` (names unique in a plan, e.g.
    ``"dk-0.25"``); ``why_none``: why there are none on this model (the plan shows it under "not tried");
    ``site_proxy``: a per-site number the method measured to choose its levels (the plan report shows it as a
    column named ``proxy_label``)."""

    configs: list[tuple[str, Any]] = field(default_factory=list)
    why_none: str | None = None
    site_proxy: dict[str, float] = field(default_factory=dict)
    proxy_label: str = ""


@dataclass(frozen=True)
class PlanContext:
    """What the planner knows when it asks a method for its levels (``levels(model, context)``) or, for a method
    of role ``"heads"``, for its head order (``rank(model, context)``).

    ``removal_order``: removal units, least important first (``[site name, [query heads]]``; empty until a method
    of role ``"heads"`` ranked them); ``budget_heads``: the heads the budget keeps (None: no head limit);
    ``sequence_length``: mean real tokens per calibration sequence; ``allow_empty_layers``: a removal may empty a
    layer; ``error(configs)``: the relative output error ``‖y − ŷ‖/‖y‖`` on the probe batches of the configs
    applied in place (the model is restored after); ``progress``: show progress (None: when a terminal);
    ``task``, ``tokenizer``: what the plan is measured on; ``ranking``: the head ranking asked for (one of the
    ``rankings`` of the method's ``Planned``); ``examples``: training examples a ranking reads;
    ``batch_size``: examples per backward of a ranking; ``finetune(model, tokenizer, task, **options)``: the
    planner's fine-tuning (``headwise.training.finetune``), for a ranking that trains (the methods sit below
    training and reach it through this)."""

    removal_order: Sequence[Sequence[Any]]
    budget_heads: int | None
    sequence_length: float
    allow_empty_layers: bool
    error: Callable[[Sequence[Any]], float]
    progress: bool | None = None
    task: Any = None
    tokenizer: Any = None
    ranking: str = ""
    examples: int = 256
    batch_size: int = 8
    budget: dict[str, float] = field(default_factory=dict)
    finetune: Callable[..., Any] | None = None


@dataclass
class Ranking:
    """What ``rank`` gives: ``scores`` per site and head (higher = more important; the plan report shows them)
    and ``order``, the removal units least important first (``[site name, [query heads]]``)."""

    scores: dict[str, list[float]]
    order: list[list[Any]]


@dataclass(frozen=True)
class AttentionCost:
    """What a method does at one site that the site's shapes do not show (its ``cost(site, length)`` hook): the
    keys each query attends to (``key_span``, e.g. a window), the query/key width per head the scores are computed
    at (``score_width``, e.g. collaborative heads' shared width), the key/value cache bytes per token and layer the
    site keeps (``kv_bytes``, e.g. a cache that holds a latent or a per-head policy), or ``uncounted``: why the
    planner cannot count this site's attention (the plan then leaves the point's FLOPs unknown and says why, never
    costs it as something else). None in a field: the shapes' own value."""

    key_span: float | None = None
    score_width: int | None = None
    kv_bytes: int | None = None
    uncounted: str | None = None
