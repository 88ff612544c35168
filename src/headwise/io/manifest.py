"""The manifest of a folder headwise writes: ``headwise-manifest.json`` lists every file with its size and sha256,
so that a torn, truncated, missing or edited file is refused when the folder is read back.

``atomic_dir`` writes it last, inside the temporary folder that is then moved into place whole. A sub-folder with a
manifest of its own (``OUT/model`` of a run) is listed by that manifest only, not file by file.
``verify_manifest`` checks sizes always and hashes when asked, or by default while the listed files total at most
``HASH_LIMIT`` bytes (2 GiB).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from ..errors import HeadwiseError

MANIFEST = "headwise-manifest.json"
FORMAT = 1
HASH_LIMIT = 2 * 1024**3
_CHUNK = 8 * 1024**2
_NOTED: set[Path] = set()  # folders without a manifest already noted by this process


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _listed(folder: Path) -> list[Path]:
    """The files the manifest of ``folder`` lists (relative, sorted): everything but itself, and of a sub-folder
    with its own manifest only that manifest."""
    out = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        if here != folder and MANIFEST in files:
            dirs.clear()
            files = [MANIFEST]
        out += [(here / name).relative_to(folder) for name in files if here / name != folder / MANIFEST]
    return sorted(out)


def write_manifest(folder: str | os.PathLike) -> Path:
    """Write ``folder/headwise-manifest.json`` (``{"format": 1, "files": {relative path: {"size", "sha256"}}}``)
    for the files ``folder`` holds now; call it when nothing more will be written there."""
    folder = Path(folder)
    files = {str(rel): {"size": (folder / rel).stat().st_size, "sha256": sha256_of(folder / rel)}
             for rel in _listed(folder)}
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files}, indent=1), encoding="utf-8")
    return folder / MANIFEST


def _read(folder: Path) -> dict[str, dict]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadwiseError(f"{folder / MANIFEST} is damaged ({err}); copy or save the folder again") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    good = isinstance(files, dict) and all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
        for v in files.values())
    if not good or manifest.get("format") != FORMAT:
        raise HeadwiseError(f"{folder / MANIFEST} is not a format-{FORMAT} headwise manifest; copy or save the "
                            "folder again")
    return files


def verify_manifest(folder: str | os.PathLike, verify: bool | None = None) -> bool:
    """Check the files of ``folder`` against its manifest: sizes always; sha256 with ``verify=True``, or by
    default (``None``) when they total at most ``HASH_LIMIT`` bytes (``False``: sizes only). Refuses the first
    missing, truncated, grown, torn or edited file in one line. A folder without a manifest (written before
    headwise wrote them) passes with a note, once per process; returns whether a manifest was checked."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        if folder.resolve() not in _NOTED:
            _NOTED.add(folder.resolve())
            print(f"headwise: note: {folder} has no {MANIFEST} (written before headwise recorded one): its files "
                  "are not verified; save it again to add one", file=sys.stderr)
        return False
    files = _read(folder)
    fix = "the file is damaged or truncated, or was edited: copy or save the folder again"
    for rel, entry in files.items():
        path = folder / rel
        if not path.is_file():
            raise HeadwiseError(f"{path} is missing (listed in {MANIFEST}); {fix}")
        size = path.stat().st_size
        if size != entry["size"]:
            raise HeadwiseError(f"{path} has {size:,} bytes where {MANIFEST} records {entry['size']:,}; {fix}")
    total = sum(entry["size"] for entry in files.values())
    if verify or (verify is None and total <= HASH_LIMIT):
        for rel, entry in files.items():
            if sha256_of(folder / rel) != entry["sha256"]:
                raise HeadwiseError(f"{folder / rel} does not match its sha256 in {MANIFEST} (a torn copy?); {fix}")
    return True
