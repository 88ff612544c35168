"""The tested transformers range: declared once in pyproject and version.py (kept in step here), refused at import
outside it with one line naming the range."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headwise.errors import HeadwiseError
from headwise.version import TRANSFORMERS_RANGE, check_transformers, installed_transformers

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_declares_the_range_the_import_checks():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"transformers{TRANSFORMERS_RANGE}" in [dep.replace(" ", "") for dep in declared]
    assert TRANSFORMERS_RANGE == ">=5.24,<6"


@pytest.mark.parametrize("version", ["5.24.0", "5.24.1", "5.30.0.dev0", "5.99"])
def test_versions_in_the_range_pass(version):
    check_transformers(version)


@pytest.mark.parametrize("version", ["5.2.0", "5.23.0", "4.57.6", "6.0.0", "6.0.0rc1"])
def test_versions_outside_the_range_are_refused_naming_it(version):
    with pytest.raises(HeadwiseError, match=rf"needs transformers>=5\.24,<6 .* but {version} is installed: pip install"):
        check_transformers(version)


def test_an_unreadable_version_is_refused():
    with pytest.raises(HeadwiseError, match="no release number"):
        check_transformers("unknown")


def test_the_installed_version_is_in_the_range():
    check_transformers(installed_transformers())


def test_import_headwise_names_the_range_under_an_old_transformers(tmp_path):
    """A metadata folder of transformers 5.2.0 first on the path: ``import headwise`` stops before any model code,
    with the range in its last line."""
    info = tmp_path / "transformers-5.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.2.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    done = subprocess.run([sys.executable, "-c", "import headwise"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "headwise needs transformers>=5.24,<6" in last and "5.2.0 is installed" in last


def test_make_test_floor_installs_the_declared_floor():
    makefile = (ROOT / "Makefile").read_text()
    floor = next(line.split("?=")[1].strip() for line in makefile.splitlines()
                 if line.startswith("TRANSFORMERS_FLOOR ?="))
    assert TRANSFORMERS_RANGE.startswith(f">={'.'.join(floor.split('.')[:2])},")
    assert "make test-floor" in (ROOT / ".ci" / "run").read_text()
