"""The README's first two Python blocks run on their own (each in a fresh interpreter) and twice in the same folder.
The second block fine-tunes one epoch on STS-B train; here it stops after 2 steps (``max_steps=2`` added to its
``finetune_stsb`` call, the only change), which runs the same code path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FINETUNE = "head_learning_rate=0.1)"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[:2]


@pytest.mark.slow
def test_readme_python_blocks_run_alone_and_twice(tmp_path):
    first, second = python_blocks()
    assert FINETUNE in second
    second = second.replace(FINETUNE, "head_learning_rate=0.1, max_steps=2)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    for block in (first, second):
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, f"{block}\n{done.stderr[-3000:]}"
    assert (tmp_path / "minilm-pruned" / "config.json").is_file()
