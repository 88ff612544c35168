"""One way to stop, to reach the hub and to read a model: a SIGINT while ``main()`` gives up its outputs' claims,
a hub endpoint that never answers, and a config that disagrees with its weights each end in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
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


def silent_endpoint() -> tuple[str, socket.socket]:
    """A loopback server that accepts connections and never answers: ``(HF_ENDPOINT, listening socket)``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed by the test
                return

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", server


def hub_env(endpoint: str, tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return {**env, "PYTHONPATH": SRC, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home"), **extra}


def test_a_hub_that_never_answers_gives_one_line_within_60_seconds(tmp_path):
    endpoint, server = silent_endpoint()
    try:
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "headwise", "sites", "--model", "gpt2"], capture_output=True,
                                text=True, timeout=120, env=hub_env(endpoint, tmp_path, HEADWISE_HUB_TIMEOUT="5"))
        elapsed = time.monotonic() - started
    finally:
        server.close()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and elapsed < 60, (elapsed, result.stderr[-2000:])
    assert lines[0].startswith(f"headwise: asking the hub ({endpoint}) for gpt2 (waits at most 5 s")
    assert lines[1:] == [f"headwise: error: the hub at {endpoint} did not answer within 5 s for gpt2 "
                         "($HEADWISE_HUB_TIMEOUT); check the network and HF_ENDPOINT, set HF_HUB_OFFLINE=1 to use "
                         "the local cache only, or pass a local model folder"]


def test_an_endpoint_that_refuses_and_an_uncached_model_offline_are_one_line(tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there: connections are refused
    refused = subprocess.run([sys.executable, "-m", "headwise", "sites", "--model", "org/model"], capture_output=True,
                             text=True, timeout=120, env=hub_env(endpoint, tmp_path))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(
        f"headwise: error: could not reach the hub at {endpoint} for org/model: ConnectError")
    cached_only = subprocess.run([sys.executable, "-m", "headwise", "sites", "--model", "org/model"],
                                 capture_output=True, text=True, timeout=120,
                                 env=hub_env(endpoint, tmp_path, HF_HUB_OFFLINE="1"))
    assert cached_only.returncode == 2 and cached_only.stderr.strip().splitlines() == [
        "headwise: error: model org/model is not in the local hub cache and HF_HUB_OFFLINE is set, so the hub is not "
        "asked: unset HF_HUB_OFFLINE to download it, or pass a local folder"]


def test_the_files_fetched_from_a_hub_repository():
    from headwise.io.hub import patterns

    files = ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5", "onnx/model.onnx",
             "onnx/config.json", "tokenizer.json", "vocab.txt", "merges.txt", "spiece.model", "source.spm",
             "1_Pooling/config.json", "README.md", ".gitattributes", "flax_model.msgpack"]
    assert patterns(files) == ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "merges.txt",
                               "spiece.model", "source.spm", "1_Pooling/config.json"]
    assert patterns(["config.json", "pytorch_model.bin", "tf_model.h5"]) == ["config.json", "pytorch_model.bin"]


def test_a_config_that_disagrees_with_its_weights_is_one_line_naming_folder_and_field(tmp_path, capsys):
    import json

    import headwise
    from headwise.cli import main
    from headwise.runtime import add_gates
    from tiny import tiny_model

    plain, ours = tmp_path / "plain", tmp_path / "ours"
    tiny_model("bert").save_pretrained(plain)
    gated = tiny_model("bert")
    add_gates(gated)
    headwise.save_pretrained(gated, ours)
    (ours / "headwise-manifest.json").unlink()  # edited on purpose (the manifest would name config.json)
    capsys.readouterr()
    for folder in (plain, ours):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"hidden_size": 64}))  # the weights hold 32
        assert main(["sites", "--model", str(folder)]) == 2
        lines = [line for line in capsys.readouterr().err.strip().splitlines() if "has no headwise-manifest.json" not in line]
        assert len(lines) == 1 and lines[0].startswith(
            f"headwise: error: {folder}: config.json's hidden_size = 64 does not fit the weights: "), lines
        assert "is [97, 32] in the weights file but [97, 64] by the config" in lines[0]
