"""Former path of ``headwise.training.recipes`` (issue 70), one release."""

from typing import Any

from ..errors import moved


def __getattr__(name: str) -> Any:
    from ..training import recipes

    return moved(recipes, name, __name__)
