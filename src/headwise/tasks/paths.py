"""Where task data is found: an explicit path, ``$HEADWISE_DATA_DIR``, or ``shared/data`` above the working
directory (or above the installed package)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import HeadwiseError
from ..io.files import read_text

ENV = "HEADWISE_DATA_DIR"


def data_roots() -> list[Path]:
    roots = [Path(os.environ[ENV])] if os.environ.get(ENV) else []
    for start in (Path.cwd(), Path(__file__).resolve()):
        roots += [parent / "shared" / "data" for parent in [start, *start.parents]]
    return roots


def shared_data(relative: str, flag: str) -> Path:
    """``shared/data/<relative>`` from the first root that has it; an error naming ``flag`` otherwise."""
    for root in data_roots():
        if (root / relative).exists():
            return root / relative
    raise HeadwiseError(f"no data given and shared/data/{relative} was not found (looked in ${ENV} and in "
                        f"shared/data above the working directory); pass {flag}")


def check_sizes(task: str, **sizes: int | None) -> None:
    """Refuse a task option that counts or sizes something (``limit``, ``batch_size``, ``max_length``, …) and is
    not a positive integer (None: not given)."""
    for option, value in sizes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise HeadwiseError(f"task {task}: {option}={value!r} must be a positive integer (--{option.replace('_', '-')}"
                                " N with N ≥ 1)")


def existing_file(path: str | os.PathLike, what: str, fix: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise HeadwiseError(f"{what} not found: {path}; {fix}")
    return path


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file, gzip-compressed when it ends in ``.gz`` (not UTF-8: refused with the line)."""
    return read_text(path).splitlines()
