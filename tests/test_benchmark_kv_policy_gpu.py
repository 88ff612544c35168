"""``benchmarks/kv_policy_gpu.py`` runs on the CPU in its quick mode (small shapes): every eager arm, the ratios and
the equal-memory row land in its results files. (The compiled arms are covered by tests/test_kvcache_static.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kv_policy_gpu.py"


def test_the_gpu_benchmark_runs_on_the_cpu_in_quick_mode(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--rows", "256",
                           "--compiled-rows", "", "--new", "3", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "kv_policy_gpu_quick.json").read_text())
    row = result["rows"]["256"]
    assert set(row["arms"]) == {"plain-dynamic", "headwise-full", "policy-eager"}
    assert row["arms"]["policy-eager"]["kv_bytes"] < 0.55 * row["arms"]["plain-dynamic"]["kv_bytes"]
    assert row["arms"]["headwise-full"]["kv_bytes"] == row["arms"]["plain-dynamic"]["kv_bytes"]
    assert set(row["ratios"]) == {"policy-eager"} and row["ratios"]["policy-eager"]["decode"] > 0
    equal = result["equal_memory"]
    assert equal["policy-eager"]["batch"] > equal["plain-dynamic"]["batch"]  # half the bytes: more rows fit
    assert result["card"].startswith("CPU") and result["torch"] and result["transformers"]
    assert "| 256 | policy-eager |" in (tmp_path / "kv_policy_gpu_quick.md").read_text()


def test_the_gpu_benchmark_refuses_a_missing_gpu_and_unknown_rows(tmp_path):
    import torch

    if not torch.cuda.is_available():
        done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True)
        assert done.returncode == 2 and "--device cpu --quick" in done.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--rows", "9k"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unknown rows ['9k']" in done.stderr
