"""The method contract: every method is one config class, registered once with how to apply and remove it.

>>> headwise.apply(model, QuantizationConfig(quantizer="log3", selection=Selection(kinds=["enc-self"])))
>>> headwise.remove(model, "quantization")                 # raises if nothing is attached (missing_ok=True: quiet)
>>> config_to_dict(config)                                  # {"method": "quantization", "version": 1, "config": {...}}

A method is a light ``Declaration`` (``headwise.declaration``: its name, config, examples, how the planner tries it)
bound to what it does, a ``MethodHooks`` subclass, with ``@register(DECLARATION)`` (docs/adding.md);
``headwise.apply`` dispatches on the config's type, the contract test (tests/test_method_contract.py) runs over
every registered method, and ``headwise edit METHOD`` builds its options from the config's fields. This module
imports no torch: the command line reads declarations (``declarations``) and configs without it.

The journal (``model.config.headwise["journal"]``) lists, oldest first, every edit a freshly built model must
replay before its saved weights fit: ``{"method", "version", "config", "state"}`` (``state``: what the method's
``replay`` needs, e.g. the heads kept per site). ``headwise.from_pretrained`` replays it through this registry; ops
attached at sites (gates, quantizers, ...) are saved beside it by the runtime.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import inspect
import importlib
import sys
import typing
import warnings
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .declaration import AttentionCost, Declaration, Levels, PlanContext, Ranking
from .errors import HeadwiseError
from .flags import typed_fields
from .keywords import with_keywords
from .lazy import load
from .sites.selection import Selection

if TYPE_CHECKING:
    from torch import nn

    from .sites import AttentionSite


@dataclass
class MethodConfig:
    """Base of every method config: a dataclass validated in ``__post_init__``, with a keyword-only ``selection``."""

    selection: Selection = field(default_factory=Selection, kw_only=True)

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        """The sites this config edits in ``model``."""
        return self.selection.sites(model)

    def merge_kinds(self, kinds: Sequence[str] | None) -> tuple[str, ...] | None:
        """For configs that also take ``kinds=`` (a shorthand for ``selection.kinds``): one value, or a conflict."""
        self.selection = with_keywords(Selection, self.selection, kinds=kinds)
        return self.selection.kinds

    def whole_model(self, method: str) -> None:
        """Refuse a selection for a method that edits every site it can (no silent widening)."""
        if not self.selection.everything:
            raise HeadwiseError(f"{method} edits every site it applies to; it takes no selection "
                                f"(got {self.selection})")


class MethodHooks:
    """What a method does, as named hooks (the way peft's methods and torchao's handlers read): subclass it beside
    the method's code and bind it to the method's declaration with ``@register(DECLARATION)``.

    Required: ``attach(model, config, **inputs)`` (performs the edit in place; ``inputs``: data that is not
    configuration, such as calibration batches; returns what the method's verb returns) and ``example(model)``
    (a small config for that model: the contract test, docs). Reversible methods give ``detach(model)`` and
    ``present(model)`` (both or neither: a method that rewrites weights gives neither). The former hook names
    ``apply`` / ``remove`` (``RENAMED_HOOKS``) still bind for one release, with a ``FutureWarning``. A method
    that records journal entries gives ``replay(model, entry)`` (``legacy_kind``: the name of its format-1 edit records). A
    planned method (``Declaration.planned``) gives ``levels(model, context) -> Levels`` and ``describe(config) ->
    str`` (and ``at_site(config, site name) -> str | None`` for the plan's per-layer table); one of role
    ``"heads"`` also ``rank(model, context) -> Ranking``. ``cost(site, length) -> AttentionCost | None`` says what
    the method changes at a site that its shapes do not show (a window, a shared width, a kernel, the bytes its cache
    keeps). ``measure_through(model) -> ContextManager | None``: where a plain forward does not compute what the
    method does (a KV policy acts only on ``generate()``'s cache), a context under which the model's forwards do;
    the planner measures every score, output and latency of an edit with the method inside it. A calibrated
    method gives ``calibration_tokens(model) -> int``: the real tokens per site its fit needs on ``model``, which
    the planner checks before any work.

    ``identity``: the example changes no output; ``meta``: it applies on the ``meta`` device (False for methods
    that fit or decompose weights)."""

    identity: bool = False
    meta: bool = True
    legacy_kind: str | None = None
    attach: Callable[..., Any] | None = None
    example: Callable[[nn.Module], Any] | None = None
    detach: Callable[[nn.Module], Any] | None = None
    present: Callable[[nn.Module], bool] | None = None
    replay: Callable[[nn.Module, dict[str, Any]], None] | None = None
    levels: Callable[[nn.Module, PlanContext], Levels] | None = None
    describe: Callable[[Any], str] | None = None
    at_site: Callable[[Any, str], str | None] | None = None
    rank: Callable[[nn.Module, PlanContext], Ranking] | None = None
    cost: Callable[[AttentionSite, float], AttentionCost | None] | None = None
    measure_through: Callable[[nn.Module], AbstractContextManager | None] | None = None
    calibration_tokens: Callable[[nn.Module], int] | None = None


def missing_hooks(declaration: Declaration, hooks: MethodHooks) -> list[str]:
    """The hooks ``declaration`` needs that ``hooks`` lacks, each with why (empty: complete)."""
    def has(name: str) -> bool:
        return callable(getattr(hooks, name, None))

    needed = {"attach": "every method", "example": "every method"}
    if has("detach") != has("present"):
        needed["present" if has("detach") else "detach"] = "a reversible method gives detach and present"
    if hooks.legacy_kind:
        needed["replay"] = "legacy_kind names journal records, which replay rebuilds"
    if declaration.planned is not None:
        needed |= {"levels": "a planned method", "describe": "a planned method"}
        if declaration.planned.role == "heads":
            needed["rank"] = "a planned method of role 'heads'"
    return [f"{name} ({why})" for name, why in needed.items() if not has(name)]


@dataclass(frozen=True, kw_only=True)
class Method:
    """A registered method: its ``declaration`` (what the tools that do not run it read) and its ``hooks`` (what
    it does). The hooks and the declaration's fields are read through it (``method.attach``, ``method.name``)."""

    declaration: Declaration
    hooks: MethodHooks

    def __getattr__(self, name: str) -> Any:
        if name in RENAMED_HOOKS:
            warnings.warn(f"Method.{name} is now Method.{RENAMED_HOOKS[name]}; {name!r} still works for one release",
                          FutureWarning, stacklevel=2)
            name = RENAMED_HOOKS[name]
        if name in HOOKS:
            return getattr(self.hooks, name)
        if name in DECLARED:
            return getattr(self.declaration, name)
        raise AttributeError(f"Method has no attribute {name!r}")

    @property
    def reversible(self) -> bool:
        return callable(self.hooks.detach)

    @property
    def sweep(self) -> Any:
        """Deprecated: how the planner tries it, as one ``headwise.sweep.Sweep`` (``declaration.planned`` and the
        hooks ``levels``, ``describe``, ``at_site`` now)."""
        warnings.warn("Method.sweep is deprecated; read method.planned and the hooks levels, describe, at_site",
                      FutureWarning, stacklevel=2)
        from .sweep import Sweep

        planned = self.declaration.planned
        return None if planned is None else Sweep._of(planned, self.hooks)


HOOKS = frozenset(name for name in vars(MethodHooks) if not name.startswith("_"))
RENAMED_HOOKS = {"apply": "attach", "remove": "detach"}  # former hook names: bound for one release, with a notice
DECLARED = frozenset(f.name for f in dataclasses.fields(Declaration))
METHODS: dict[str, Method] = {}

# The method packages: the one list a built-in method package joins (docs/adding.md). Each holds a light
# ``declaration`` module (``DECLARATIONS``, read without torch by the command line and the docs index, through
# ``declarations``) and registers its hooks when the package loads (``load_methods``: checkpoint readers and the
# command line load them before a journal is replayed or a verb runs). Named as strings, not imports of a higher
# layer; tests/test_import_layers.py puts them in the methods layer.
METHOD_PACKAGES = ("headwise.pruning", "headwise.collaborative", "headwise.quantization", "headwise.mixing",
                   "headwise.mechanisms", "headwise.conversion", "headwise.kvcache")


def declarations() -> dict[str, Declaration]:
    """Every method's declaration by name: the built-in packages' (their ``declaration`` modules, which import no
    torch), then those of methods registered in this process (plug-ins)."""
    out = {}
    for package in METHOD_PACKAGES:
        for declaration in importlib.import_module(f"{package}.declaration").DECLARATIONS:
            out[declaration.name] = declaration
    return out | {name: m.declaration for name, m in METHODS.items() if name not in out}


def load_methods() -> None:
    """Load every method package whole (``METHOD_PACKAGES``), so that every method and saved op type is
    registered; a built-in declaration whose hooks did not register raises."""
    for package in METHOD_PACKAGES:
        load(package)
    unbound = sorted(set(declarations()) - set(METHODS))
    if unbound:
        raise HeadwiseError(f"declared methods {unbound} registered no hooks: their package's method module binds "
                            "each declaration with @register(DECLARATION)")


def register(declaration: Declaration) -> Callable[[type[MethodHooks]], type[MethodHooks]]:
    """Bind ``declaration`` to a ``MethodHooks`` class (a class decorator); the class is returned unchanged.

    >>> @register(GQA)
    ... class GQAHooks(MethodHooks):
    ...     def attach(self, model, config, **inputs): ...
    ...     def example(self, model): ..."""
    def bind(cls: type[MethodHooks]) -> type[MethodHooks]:
        if not (isinstance(cls, type) and issubclass(cls, MethodHooks)):
            raise HeadwiseError(f"@register({declaration.name}) decorates a MethodHooks subclass, got {cls!r}")
        for old, new in RENAMED_HOOKS.items():
            if callable(getattr(cls, old, None)) and getattr(cls, new) is None:
                warnings.warn(f"{cls.__name__}.{old}: the hook is now named {new!r}; {old!r} still works for one "
                              "release", FutureWarning, stacklevel=2)
                setattr(cls, new, inspect.getattr_static(cls, old))  # a staticmethod stays one
        _add(Method(declaration=declaration, hooks=cls()))
        return cls

    return bind


def _add(method: Method) -> Method:
    """Put ``method`` in the registry once its hooks are complete and its names and config are its own."""
    d = method.declaration
    missing = missing_hooks(d, method.hooks)
    if missing:
        raise HeadwiseError(f"method {d.name!r} misses hooks: {'; '.join(missing)}")
    for other in METHODS.values():
        if (other.name == d.name) != (other.config is d.config):
            raise HeadwiseError(f"method {d.name!r} with {d.config.__name__} clashes with the registered method "
                                f"{other.name!r} ({other.config.__name__})")
        if other.name != d.name and {d.name, *d.aliases} & {other.name, *other.aliases}:
            raise HeadwiseError(f"method {d.name!r}: its name or an alias ({', '.join(d.aliases)}) is taken by "
                                f"the registered method {other.name!r}")
    METHODS[d.name] = method
    return method


def register_method(name: str, config: type, attach: Callable[..., Any], *, example: Callable[[nn.Module], Any],
                    detach: Callable[[nn.Module], Any] | None = None, present: Callable[[nn.Module], bool] | None = None,
                    version: int = 1, summary: str = "", identity: bool = False, meta: bool = True,
                    replay: Callable[[nn.Module, dict[str, Any]], None] | None = None,
                    legacy_kind: str | None = None, sweep: Any = None, aliases: Sequence[str] = (),
                    remove: Callable[[nn.Module], Any] | None = None) -> Method:
    """The short form of ``@register(Declaration(...))`` for a method given as functions (a plug-in's few
    lines); returns the ``Method``. Deprecated: ``remove`` (now ``detach``) and ``sweep`` (a ``headwise.sweep.Sweep``:
    declare ``planned=Planned(...)`` and give the hooks ``levels`` and ``describe``, docs/adding.md)."""
    planned, planner = None, {}
    if remove is not None:
        warnings.warn("register_method(remove=...) is now detach=...; remove= still works for one release",
                      FutureWarning, stacklevel=2)
        detach = remove
    if sweep is not None:
        warnings.warn("register_method(sweep=Sweep(...)) is deprecated; declare planned=Planned(...) with the hooks "
                      "levels and describe (docs/adding.md)", FutureWarning, stacklevel=2)
        planned, planner = sweep.planned(), sweep.hooks()
    declaration = Declaration(name=name, config=config, summary=summary, aliases=tuple(aliases), version=version,
                              planned=planned)
    hooks = type(f"{config.__name__}Hooks", (MethodHooks,), {
        "identity": identity, "meta": meta, "legacy_kind": legacy_kind, **{
            key: staticmethod(fn) for key, fn in dict(attach=attach, example=example, detach=detach, present=present,
                                                       replay=replay, **planner).items() if fn is not None}})
    return _add(Method(declaration=declaration, hooks=hooks()))


def method_of(what: "str | type | Any") -> Method:
    """The method of a name (or a former name: a saved record's), a config class or a config."""
    for method in METHODS.values():
        if what == method.name or what in method.aliases or what is method.config or type(what) is method.config:
            return method
    label = what if isinstance(what, str) else getattr(what, "__name__", type(what).__name__)
    raise HeadwiseError(f"no method {label!r}; registered: {', '.join(sorted(METHODS))}")


def method_named(text: str, *, planned: bool = False) -> Method:
    """The method a user named (``headwise edit``; with ``planned``, where plans name methods: ``plan(methods=...)``,
    ``--methods``): its name, ``-`` for ``_`` allowed, or a former name (``Declaration.aliases``; with ``planned``
    also ``Planned.former``), which still works with a ``FutureWarning`` for one release (the command line shows
    it as one line)."""
    name = text.strip().replace("-", "_")
    former = {old: m for m in METHODS.values() if planned and m.planned for old in m.planned.former}
    method = former.get(name) or method_of(name)
    if name != method.name:
        warnings.warn(f"method {name!r} is now {method.name!r} (the registered method's name); {name!r} still works "
                      "for one release", FutureWarning, stacklevel=2)
    return method


def apply(model: nn.Module, config: Any, **inputs: Any) -> Any:
    """Apply the method of ``config`` to ``model`` in place; returns what the method's verb returns."""
    from .runtime.dispatch import offloaded

    method = method_of(config)
    # meta tensors that Accelerate fetches are weights: the method refuses the offloaded sites it would rewrite
    if not method.meta and any(p.is_meta for p in model.parameters()) and not offloaded(model):
        raise HeadwiseError(f"{method.name} fits the model's weights, which are on the meta device; load the real "
                            "weights first")
    return method.attach(model, config, **inputs)


@contextlib.contextmanager
def measured(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, ``model``'s forwards compute what every method it carries does (each method's
    ``measure_through`` context, e.g. a KV policy's cache): how a plan scores, probes and times an edit, and how
    ``headwise apply`` scores the applied one."""
    with contextlib.ExitStack() as stack:
        for method in METHODS.values():
            context = method.measure_through(model) if method.measure_through is not None else None
            if context is not None:
                stack.enter_context(context)
        yield model


def remove(model: nn.Module, method: "str | type | Any", *, missing_ok: bool = False) -> nn.Module:
    """Undo a reversible method (the model computes what it did before). Raises when the model does not carry it,
    unless ``missing_ok``, and always for a method that rewrote weights (reload the original model instead)."""
    m = method_of(method)
    if not m.reversible:
        raise HeadwiseError(f"{m.name} rewrites the model's weights and cannot be removed in place; reload the model "
                            "from before the edit")
    if not m.present(model):
        if missing_ok:
            return model
        raise HeadwiseError(f"{type(model).__name__} carries no {m.name}; nothing to remove (missing_ok=True to allow)")
    m.detach(model)
    return model


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def config_to_dict(config: Any) -> dict[str, Any]:
    """``{"method", "version", "config"}`` with JSON values only."""
    m = method_of(config)
    return {"method": m.name, "version": m.version, "config": _plain(config)}


def config_from_dict(record: dict[str, Any]) -> Any:
    """The config a ``config_to_dict`` record describes (validated by the config's own ``__post_init__``)."""
    if not isinstance(record, dict) or {"method", "version", "config"} - set(record):
        raise HeadwiseError(f"a method record needs 'method', 'version' and 'config', got {record!r}")
    if not isinstance(record["method"], str) or not isinstance(record["version"], int) \
            or isinstance(record["version"], bool) or not isinstance(record["config"], dict):
        raise HeadwiseError(f"a method record needs a method name, an integer version and a config mapping, got "
                            f"{record!r}")
    load_methods()  # a record may name any built-in method, whichever packages the caller imported
    m = method_of(record["method"])
    if record["version"] > m.version:
        raise HeadwiseError(f"the {m.name} record is version {record['version']}, newer than this headwise "
                            f"(version {m.version}); upgrade headwise")
    names = {f.name for f in dataclasses.fields(m.config) if f.init}
    former = getattr(m.config, "FORMER", {})  # a field's former name, read quietly from a saved record
    values = {former.get(k, k): v for k, v in record["config"].items()}
    moved = sorted(set(values) & set(getattr(m.config, "MOVED", {})))
    if moved:  # an older record held how the method was trained: not what is attached, so it is set aside
        print(f"headwise: the {m.name} record (version {record['version']}) holds training settings {moved}; they "
              f"belong to {m.config.MOVED[moved[0]]} now and are not part of the config", file=sys.stderr)
        values = {k: v for k, v in values.items() if k not in moved}
    unknown = sorted(set(values) - names)
    if unknown:
        raise HeadwiseError(f"the {m.name} record has unknown fields {unknown}; known: {sorted(names)}")
    wrong = [f"{f.name}={values[f.name]!r} (expected {_shown(hint)})" for f, hint in config_fields(m.config)
             if f.name in values and f.name != "selection" and not _fits(values[f.name], hint)]
    if wrong:
        raise HeadwiseError(f"the {m.name} record's config has fields of the wrong type: {'; '.join(wrong)}")
    try:
        if isinstance(values.get("selection"), dict):
            values["selection"] = Selection(**values["selection"])
        return m.config(**values)
    except (TypeError, ValueError, AttributeError) as err:  # a field of the wrong type that __post_init__ met
        raise HeadwiseError(f"the {m.name} record's config {record['config']!r} is not valid: {err}") from None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON ``value`` can be a field of type ``hint`` (scalars, ``Literal``, unions, sequences and mappings
    are checked; other types are left to the config's ``__post_init__``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, collections.abc.Sequence):
        inner = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(_fits(v, inner) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(v, args[1]) for v in value.values()) if args else \
            isinstance(value, dict)
    return True


def _shown(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "").replace("collections.abc.", "")


def config_fields(config: type) -> list[tuple[dataclasses.Field, Any]]:
    """``(field, resolved type)`` of a config's init fields (what ``headwise edit`` turns into options)."""
    return typed_fields(config)


# --- the journal --------------------------------------------------------------------------------------------------


def journal(model: nn.Module) -> list[dict[str, Any]]:
    """The journal entries of ``model``, oldest first (a copy)."""
    return list((getattr(model.config, "headwise", None) or {}).get("journal", []))


def entries(model: nn.Module, method: str) -> list[dict[str, Any]]:
    """The journal entries of one method, oldest first."""
    name = method_of(method).name
    return [e for e in journal(model) if e["method"] == name]


def record(model: nn.Module, method: str, config: Any = None, state: dict[str, Any] | None = None, *,
           replace: bool = False) -> dict[str, Any]:
    """Append ``{"method", "version", "config", "state"}`` to the journal of ``model`` (call it right after the
    edit); ``replace``: the entry replaces the method's earlier ones (a policy that supersedes the last).
    ``config``: the method's config (or its dict; None for an edit with no config of its own). Returns the entry."""
    m = method_of(method)
    if m.replay is None:
        raise HeadwiseError(f"method {m.name!r} registered no replay function; it cannot record journal entries")
    entry = {"method": m.name, "version": m.version, "config": _plain(config), "state": _plain(state or {})}
    _write(model, [e for e in journal(model) if not (replace and e["method"] == m.name)] + [entry])
    return entry


def unrecord(model: nn.Module, method: str) -> None:
    """Drop every journal entry of ``method`` (the method was removed)."""
    name = method_of(method).name
    _write(model, [e for e in journal(model) if e["method"] != name])


def _write(model: nn.Module, entries: list[dict[str, Any]]) -> None:
    state = dict(getattr(model.config, "headwise", None) or {})
    state["journal"] = entries
    model.config.headwise = state


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def journal_problems(entries: Any, where: str = "journal") -> list[str]:
    """What is wrong with the shape of saved journal ``entries`` (a list of mappings with ``method`` (str),
    ``version`` (int), ``config`` (mapping or null) and ``state`` (mapping)): one line per problem, empty when
    none. Whether the methods are known is ``replay``'s check."""
    if not isinstance(entries, list):
        return [f"{where} is a {_kind(entries)}, not a list of entries"]
    problems = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{at} is a {_kind(entry)}, not a mapping with method, version, config and state")
            continue
        absent = [key for key in ("method", "version", "config", "state") if key not in entry]
        if absent:
            problems.append(f"{at}: a journal entry needs 'method', 'version', 'config' and 'state' (missing "
                            f"{', '.join(absent)})")
        for key, kinds, wanted in (("method", (str,), "a string"), ("version", (int,), "an int"),
                                   ("config", (dict, type(None)), "a mapping or null"),
                                   ("state", (dict,), "a mapping")):
            value = entry.get(key)
            if key in entry and (not isinstance(value, kinds) or isinstance(value, bool)):
                problems.append(f"{at}.{key} is {value!r} (a {_kind(value)}); expected {wanted}")
    return problems


def replay(model: nn.Module, entries: Sequence[dict[str, Any]], where: str) -> None:
    """Replay journal ``entries`` on a freshly built model, through each method's ``replay``."""
    for entry in entries:
        if not isinstance(entry, dict) or {"method", "version", "state"} - set(entry):
            raise HeadwiseError(f"{where}: a journal entry needs 'method', 'version', 'config' and 'state', "
                                f"got {entry!r}")
        m = next((m for m in METHODS.values() if entry["method"] in (m.name, *m.aliases)), None)
        if m is None or m.replay is None:
            raise HeadwiseError(f"{where} needs method {entry['method']!r}, unknown to this headwise version (known: "
                                f"{', '.join(sorted(n for n, m in METHODS.items() if m.replay))}); upgrade headwise "
                                "or import the package that registers it")
        if entry["version"] > m.version:
            raise HeadwiseError(f"{where}: its {m.name} entry is version {entry['version']}, newer than this "
                                f"headwise (version {m.version}); upgrade headwise")
        m.replay(model, entry)


def upgrade_edits(records: Sequence[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Journal entries for the edit records of format 1 (``{"kind": ..., **fields}``): each becomes an entry of
    the method registered with that ``legacy_kind``, its fields the entry's ``state`` (no config was saved)."""
    by_kind = {m.legacy_kind: m for m in METHODS.values() if m.legacy_kind}
    out = []
    for old in records:
        m = by_kind.get(old.get("kind"))
        if m is None:
            raise HeadwiseError(f"{where} needs edit {old.get('kind')!r}, unknown to this headwise version (known: "
                                f"{', '.join(sorted(by_kind))}); upgrade headwise or import the package that "
                                "defines it")
        out.append({"method": m.name, "version": 1, "config": None,
                    "state": {k: v for k, v in old.items() if k != "kind"}})
    return out
