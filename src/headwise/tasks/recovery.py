"""Former path of ``headwise.training.recovery`` (issue 70), one release."""

from ..errors import moved


def __getattr__(name: str) -> object:
    from ..training import recovery

    return moved(recovery, name, __name__)
