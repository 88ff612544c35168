"""The package as a user installs it: a wheel built from this checkout, installed into a fresh virtual environment
(its own site-packages; torch, transformers and the MiniLM weights reused from the running environment through a
.pth line, never headwise), runs ``headwise eval stsb`` on the STS-B copy shipped inside the wheel, from a folder
with no ``shared/`` above it and a fresh HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow
def test_wheel_installs_and_evaluates_stsb_without_shared_data(tmp_path: Path) -> None:
    source = tmp_path / "source"  # build outside the checkout: no build/ or egg-info left in the work tree
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HEADWISE_STSB_DIR", "HEADWISE_DATA_DIR")}
    env |= {"HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
         str(source)], tmp_path, env)
    wheel = next(wheels.glob("headwise-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("sts-dev.tsv", "sts-train.tsv", "LICENSE.txt"):
        assert f"headwise/data/stsb/{shipped}" in names
    for shipped in ("wikitext-2-valid-tail.txt", "LICENSE.txt", "README.md"):  # the suite's prose haystack
        assert f"headwise/data/prose/{shipped}" in names

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    own = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   tmp_path, env).stdout.strip())
    # dependencies from the running environment, appended after the venv's own site-packages (a plain path line
    # does not run that environment's .pth files, so its editable headwise stays invisible)
    (own / "reuse-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        tmp_path, env)

    work = tmp_path / "work"
    work.mkdir()
    assert not any((parent / "shared").exists() for parent in [work, *work.parents])
    where = run([str(python), "-c", "import headwise; print(headwise.__file__)"], work, env).stdout.strip()
    assert where.startswith(str(own)), f"headwise imported from {where}, not from the wheel"
    out = run([str(venv / "bin" / "headwise"), "eval", "stsb", "--limit", "50", "--json"], work, env).stdout
    import json

    result = json.loads(out)
    assert result["pairs"] == 50 and result["total_pairs"] == 1500
    assert result["file"].startswith(str(own / "headwise" / "data" / "stsb"))
    assert 50 < result["spearman"] <= 100  # MiniLM is strong on STS-B; random weights score near 0
    module = run([str(python), "-m", "headwise", "--json", "sites"], work, env).stdout
    assert len(json.loads(module)) == 6  # MiniLM's six self-attention sites, through python -m headwise
