"""Resuming a long run safely: the options that shape its result are compared with those it was started with
(a difference refuses, listing what differs), and SIGTERM/SIGINT stop it at a point where a complete state can be
saved."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import HeadwiseError


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``name recorded → now`` for every option whose value differs (missing: None)."""
    return [f"{key} {recorded.get(key)!r} → {now.get(key)!r}" for key in sorted(set(recorded) | set(now), key=str)
            if recorded.get(key) != now.get(key)]


def refuse_changed(recorded: dict[str, Any], now: dict[str, Any], what: str) -> None:
    """Refuse to resume ``what`` when an option that shapes the result differs from the one it started with."""
    found = differences(recorded, now)
    if found:
        raise HeadwiseError(f"--resume: {what} was started with other options ({'; '.join(found)}); resume with "
                            "the options it started with, or start again without --resume")


class Stop:
    """Set once SIGTERM or SIGINT arrived while ``stop_signals`` was active: the run should save and stop."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


@contextmanager
def stop_signals() -> Iterator[Stop]:
    """While active, SIGTERM and SIGINT only set the ``Stop`` flag (the loop saves a complete state and stops at
    its next safe point); the previous handlers come back afterwards. Outside the main thread (where Python
    cannot install handlers) the flag never sets."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(number: int, frame: Any) -> None:
        stop.signal = signal.Signals(number).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
