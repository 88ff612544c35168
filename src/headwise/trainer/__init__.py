"""Former path of ``headwise.training.trainer`` (issue 70), one release."""

from ..errors import moved


def __getattr__(name: str) -> object:
    from ..training import trainer

    return moved(trainer, name, __name__)
