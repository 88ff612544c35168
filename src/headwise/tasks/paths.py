"""Where task data is found: an explicit path, ``$HEADWISE_DATA_DIR``, or ``shared/data`` above the working
directory (or above the installed package); STS-B train and dev also ship inside the package (``PACKAGED_DATA``)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import HeadwiseError
from ..io.files import read_text

ENV = "HEADWISE_DATA_DIR"
PACKAGED_DATA = Path(__file__).resolve().parents[1] / "data"  # headwise/data: the demo's STS-B, with its licence

# where a user without shared/ gets each data set (the missing-data errors say it)
SOURCES = {
    "wikitext-2": "--data wikitext:wikitext-2-raw-v1 (pip install datasets; needs internet) or any UTF-8 text file",
    "multi30k": "the task1/raw/*.gz files of github.com/multi30k/dataset, e.g. git clone --depth 1 "
                "https://github.com/multi30k/dataset multi30k && --data-dir multi30k/data/task1/raw",
}


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
    source = SOURCES.get(relative.split("/")[0])
    raise HeadwiseError(f"no data given and shared/data/{relative} was not found (looked in ${ENV} and in "
                        f"shared/data above the working directory); pass {flag}"
                        + (f"; get the data with {source}" if source else ""))


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
