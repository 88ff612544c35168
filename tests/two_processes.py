"""Run a test script under ``torchrun --nproc_per_node 2`` on the CPU (one thread per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def torchrun_two(script: Path, out: Path, port: int) -> None:
    """Run ``script out`` in 2 processes; fail with the end of stderr when it exits non-zero."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
         str(script), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
