"""The one converter between a typed field and the command line: which flag a field is (``flag``), what
``add_argument`` takes for it (``option``), and how its text becomes a value (``text_type``). Method config fields
(``headwise edit``, the verbs' method options) and mechanism arguments (``--arg NAME=VALUE``,
``mechanisms.add_args``) go through it, so a value means the same wherever it is typed.

Rules: ``bool`` is a ``--x/--no-x`` option (a typed value is ``true``/``false``, ``yes``/``no``, ``1``/``0``,
``on``/``off``; anything else is refused); a ``Literal`` or ``metadata["choices"]`` gives the choices; ``int``,
``float``, ``str`` parse as themselves, ``int | float`` as an integer or else a number, ``str | float`` as a number
or else the text; a sequence of numbers or strings is ``a,b,c``; anything else is JSON or ``@FILE`` holding JSON.
Per-field facts sit in the field's ``metadata``: ``help``, ``flag`` (when ``--FIELD`` means something else
elsewhere), ``former`` (an old spelling, kept as a hidden alias), ``positive`` (a number that must be above 0).
No torch here.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, Callable

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def list_of(kind: type) -> Callable[[str], list]:
    """An argparse ``type``: comma-separated values of ``kind``."""
    def parse(text: str) -> list:
        try:
            return [kind(part.strip()) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None

    parse.__name__ = f"list_of_{kind.__name__}"
    return parse


def json_value(text: str) -> Any:
    """An argparse ``type``: a JSON value, or ``@FILE`` holding one."""
    try:
        return json.loads(Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise argparse.ArgumentTypeError(f"expected JSON or @FILE with JSON, got {text!r} ({err})") from None


def int_or_float(text: str) -> int | float:
    """An argparse ``type``: an integer, or else a number (``--dk 192`` or ``--dk 0.25``)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def number_or_text(text: str) -> float | str:
    """An argparse ``type``: a number, or else the text (``--gate-init 3`` or ``--gate-init voita``)."""
    try:
        return float(text)
    except ValueError:
        return text


def boolean(text: str) -> bool:
    """An argparse ``type``: ``true``/``false`` (also ``yes``/``no``, ``1``/``0``, ``on``/``off``); anything
    else is refused, never read as False."""
    word = text.strip().lower()
    if word in TRUE or word in FALSE:
        return word in TRUE
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


KINDS = list_of(str)


def _unwrap(hint: Any) -> Any:
    """``X | None`` → ``X``."""
    if typing.get_origin(hint) is typing.Union or type(hint).__name__ == "UnionType":
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
        if set(inner) in ({int, float}, {str, float}):
            return inner[0] | inner[1]
    return hint


def choices_of(hint: Any, metadata: typing.Mapping[str, Any] | None = None) -> tuple | None:
    """The closed vocabulary of a field: its ``Literal``'s values or ``metadata["choices"]`` (None: open)."""
    hint = _unwrap(hint)
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    found = (metadata or {}).get("choices")
    return tuple(found) if found is not None else None


def text_type(hint: Any) -> Callable[[str], Any]:
    """How text becomes a value of type ``hint`` (an argparse ``type``), by the rules of the module docstring."""
    hint = _unwrap(hint)
    args = typing.get_args(hint)
    if hint is bool:
        return boolean
    if typing.get_origin(hint) is typing.Literal:
        kinds = {type(a) for a in args}
        return kinds.pop() if len(kinds) == 1 else str
    if hint in (int, float, str):
        return hint
    if hint == int | float:
        return int_or_float
    if hint == str | float:
        return number_or_text
    if typing.get_origin(hint) in (tuple, list, collections.abc.Sequence) and args and args[0] in (int, float, str):
        return KINDS if args[0] is str else list_of(args[0])
    return json_value


def option(hint: Any, metadata: typing.Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``add_argument`` keywords (action or type, choices, metavar, and ``positive``, which the command line's
    parser turns into its range check) for a field of type ``hint`` with ``metadata``."""
    metadata = metadata or {}
    extra = {"positive": True} if metadata.get("positive") else {}
    hint = _unwrap(hint)
    choices = choices_of(hint, metadata)
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if choices is not None:
        return {"type": text_type(hint), "choices": list(choices)} if typing.get_origin(hint) is not typing.Literal \
            else {"choices": list(choices)}
    kind = text_type(hint)
    metavar = {int: "INT", float: "FLOAT", str: "STR", int_or_float: "NUMBER", number_or_text: "NUMBER|TEXT",
               json_value: "JSON|@FILE"}.get(kind, "A,B,...")
    return {"type": kind, "metavar": metavar, **extra}


def flag(field: dataclasses.Field) -> str:
    """The field's option: ``metadata["flag"]``, else ``--name-with-dashes``."""
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def typed_fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """``(field, resolved type)`` of a dataclass's init fields."""
    hints = typing.get_type_hints(cls)
    return [(f, hints.get(f.name, Any)) for f in dataclasses.fields(cls) if f.init]


def values_from_pairs(cls: type, pairs: list[str], what: str) -> dict[str, Any]:
    """``["window=32", ...]`` → ``{"window": 32}`` for the fields of dataclass ``cls`` (``-`` for ``_`` allowed),
    each value converted by ``text_type`` and checked against its choices; a bad pair raises ``ValueError`` with
    one line naming it (``what``: whose arguments, for the message)."""
    known = {f.name: (f, hint) for f, hint in typed_fields(cls)}
    out = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise ValueError(f"--arg {pair!r}: give NAME=VALUE with NAME one of {', '.join(known) or '(none)'} "
                             f"({what})")
        field, hint = known[key]
        try:
            value = text_type(hint)(text)
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise ValueError(f"--arg {pair!r}: {key} takes {getattr(_unwrap(hint), '__name__', hint)} ({err})") \
                from None
        allowed = choices_of(hint, field.metadata)
        if allowed is not None and value not in allowed:
            raise ValueError(f"--arg {pair!r}: {key} is one of {', '.join(map(str, allowed))}")
        out[key] = value
    return out
