"""Former path of ``headwise.training.recipes`` (issue 70), one release."""

from ..errors import moved


def __getattr__(name: str) -> object:
    from ..training import recipes

    return moved(recipes, name, __name__)
