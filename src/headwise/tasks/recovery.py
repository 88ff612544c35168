"""Former path of ``headwise.training.recovery`` (issue 70), one release."""

from typing import Any

from ..errors import moved


def __getattr__(name: str) -> Any:
    from ..training import recovery

    return moved(recovery, name, __name__)
