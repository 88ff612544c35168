"""One way to stop, to reach the hub and to read a model: a SIGINT while ``main()`` gives up its outputs' claims,
a hub endpoint that never answers, and a config that disagrees with its weights each end in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1",
                                                **(env or {})})


def test_a_sigint_during_the_final_release_of_outputs_gives_no_traceback(tmp_path):
    result = run_python(f"""
        import os, signal, sys
        from headwise.cli import main
        from headwise.io import files

        files.claim_output({str(tmp_path / 'out')!r})  # held when the verb ends: main() gives it up
        release = files.release_output

        def interrupted(path):
            os.kill(os.getpid(), signal.SIGINT)  # lands while main() releases its outputs
            release(path)

        files.release_output = interrupted
        sys.exit(main(["mechanisms", "list", "--json"]))
    """)
    assert result.returncode == 130, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and result.stderr.strip().splitlines()[-1] == "headwise: interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the claim is given up all the same
