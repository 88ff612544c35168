"""Former path of ``headwise.training.trainer`` (issue 70), one release."""

from typing import Any

from ..errors import moved


def __getattr__(name: str) -> Any:
    from ..training import trainer

    return moved(trainer, name, __name__)
