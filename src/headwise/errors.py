"""One exception type for every mistake a user can make; the CLI prints it as one line. Former names
(``renamed``) warn once a call."""

import functools
import warnings
from typing import Any, Callable


class HeadwiseError(ValueError):
    """Bad input or an unsupported request. The message says what was wrong and what to do.

    A ``ValueError``, so code that already guards against bad values catches it too.
    """


class HeadwiseNote(UserWarning):
    """What headwise did in place of what was asked (e.g. more calibration data than ``--calibration-limit``, to
    meet a method's need), said once when it happens; the command line prints it as one ``headwise: note:`` line."""


def renamed(new: Callable[..., Any], old: str) -> Callable[..., Any]:
    """``new`` under its former name ``old`` (e.g. ``"Plan.apply"``): it works for one release, each call with a
    ``FutureWarning`` naming ``new`` (the command line prints it as one ``headwise: note:`` line)."""
    @functools.wraps(new)
    def former(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{old} is now {new.__qualname__}; {old.rsplit('.', 1)[-1]!r} still works for one release",
                      FutureWarning, stacklevel=2)
        return new(*args, **kwargs)

    return former
