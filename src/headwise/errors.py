"""One exception type for every mistake a user can make; the CLI prints it as one line. Former names
(``renamed``) and former module paths (``moved``) warn once a call."""

import functools
import warnings
from types import ModuleType
from typing import Any, Callable


class HeadwiseError(ValueError):
    """Bad input or an unsupported request. The message says what was wrong and what to do.

    A ``ValueError``, so code that already guards against bad values catches it too.
    """


class HeadwiseNote(UserWarning):
    """What headwise did in place of what was asked (e.g. more calibration data than ``--calibration-limit``, to
    meet a method's need), said once when it happens; the command line prints it as one ``headwise: note:`` line."""


def renamed(new: Callable[..., Any], old: str, now: str = "") -> Callable[..., Any]:
    """``new`` under its former name ``old`` (e.g. ``"Plan.apply"``): it works for one release, each call with a
    ``FutureWarning`` naming ``now`` (default: ``new``'s name; the command line prints it as one ``headwise: note:``
    line)."""
    @functools.wraps(new)
    def former(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{old} is now {now or new.__qualname__}; {old.rsplit('.', 1)[-1]!r} still works for one release",
                      FutureWarning, stacklevel=2)
        return new(*args, **kwargs)

    return former


def moved(module: ModuleType, name: str, old: str) -> Any:
    """``module``'s ``name`` read through its former module path ``old`` (a former module's ``__getattr__``): it
    works for one release, each read with a ``FutureWarning`` naming where it is now."""
    value = getattr(module, name)
    warnings.warn(f"{old}.{name} is now {module.__name__}.{name}; {old} still works for one release", FutureWarning,
                  stacklevel=3)
    return value


def renamed_fields(**former: str) -> Callable[[type], type]:
    """A class decorator over a dataclass: each former field name ``old="new"`` still works for one release as a
    keyword and as an attribute, with a ``FutureWarning``; ``cls.FORMER`` maps them for saved records (quietly)."""
    def wrap(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for old, new in former.items():
                if old in kwargs:
                    warnings.warn(f"{cls.__name__}({old}=...) is now {new}=...; {old}= still works for one release",
                                  FutureWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        for old, new in former.items():
            read = renamed(lambda self, new=new: getattr(self, new), f"{cls.__name__}.{old}", f"{cls.__name__}.{new}")
            setattr(cls, old, property(read))
        cls.FORMER = dict(former)  # type: ignore[attr-defined]
        return cls

    return wrap
