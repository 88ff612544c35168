"""Outputs on real disks (issue 44.3): a full disk, a read-only folder, a name too long, an output below a file
and an unwritable cache give one line each and keep the old output; a symlinked output is written through; a
multi-part output is complete or absent; readers of a folder being replaced see the old or the new version.

Read-only and full disks are real tmpfs mounts where the tests run as root (CI does); elsewhere those parts
skip, and the same paths are driven by a monkeypatched OS call raising the errno."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from pathlib import Path

import pytest
import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise import HeadwiseError
from headwise.io import checkpoint, files
from headwise.io.files import atomic_dir
from headwise.io.manifest import MANIFEST


def _leftovers(*folders: Path) -> list[str]:
    return [p.name for folder in folders for p in folder.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock")]


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs of the given size (and options) under ``tmp_path``; skipped where mounting is not allowed."""
    mounted = []

    def mount(size: str, readonly: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (the monkeypatched errno tests cover the same path)")
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if readonly else "")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)]).returncode != 0:
            pytest.skip("mount -t tmpfs is not allowed here")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def _old_output(out: Path) -> None:
    with atomic_dir(out) as tmp:
        (tmp / "old.txt").write_text("old")


def test_a_full_disk_refuses_up_front_in_one_line(tmpfs):
    disk = tmpfs("1m")
    with pytest.raises(HeadwiseError, match=r"cannot write .*MiB free; free space there") as err:
        headwise.save_pretrained(tiny_model("bert"), disk / "model")
    assert len(str(err.value).splitlines()) == 1 and list(disk.iterdir()) == []


def test_a_disk_that_fills_while_writing_keeps_the_old_output(tmpfs, monkeypatch):
    disk = tmpfs("96k")
    monkeypatch.setattr(files, "check_free_space", lambda path, size: None)  # as if the estimate were wrong
    _old_output(disk / "out")
    model = tiny_model("bert")
    assert checkpoint.state_bytes(model) > 96 * 1024
    with pytest.raises(HeadwiseError, match="the disk is full"):
        headwise.save_pretrained(model, disk / "out", overwrite=True)
    assert (disk / "out" / "old.txt").read_text() == "old" and _leftovers(disk) == []


def test_a_read_only_disk_gives_one_line(tmpfs):
    disk = tmpfs("1m", readonly=True)
    with pytest.raises(HeadwiseError, match="read-only") as err:
        headwise.save_pretrained(tiny_model("bert"), disk / "model")
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "read-only"),
                                         (errno.EACCES, "permission denied")])
def test_a_failing_write_keeps_the_old_output_and_leaves_nothing(tmp_path, monkeypatch, code, words):
    out = tmp_path / "out"
    _old_output(out)

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(checkpoint, "save_model", fail)
    with pytest.raises(HeadwiseError, match=words) as err:
        headwise.save_pretrained(tiny_model("bert"), out, overwrite=True)
    assert str(out) in str(err.value) and len(str(err.value).splitlines()) == 1
    assert (out / "old.txt").read_text() == "old" and _leftovers(tmp_path) == []


def test_a_name_too_long_and_an_output_below_a_file_give_one_line(tmp_path):
    with pytest.raises(HeadwiseError, match="too long"):
        headwise.save_pretrained(tiny_model("bert"), tmp_path / ("x" * 250))
    (tmp_path / "file").write_text("mine")
    with pytest.raises(HeadwiseError, match="is a file, not a folder"):
        headwise.save_pretrained(tiny_model("bert"), tmp_path / "file" / "model")
    assert (tmp_path / "file").read_text() == "mine" and _leftovers(tmp_path) == []


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    from headwise.cli import main

    (tmp_path / "file").write_text("mine")
    code = main(["prune", "--strategy", "mask", "--mask", str(tmp_path / "mask.json"), "--no-eval",
                 "--out", str(tmp_path / "file" / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "is a file, not a folder" in err, err


def test_a_symlinked_output_is_written_through_and_stays_a_link(tmp_path):
    target, link = tmp_path / "target", tmp_path / "link"
    _old_output(target)
    link.symlink_to(target)
    model = tiny_model("bert")
    with pytest.raises(HeadwiseError, match="not empty"):
        headwise.save_pretrained(model, link)
    headwise.save_pretrained(model, link, overwrite=True)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target / "model.safetensors").is_file() and not (target / "old.txt").exists()
    assert _leftovers(tmp_path) == []
    headwise.from_pretrained(link)


def test_a_multi_part_output_is_complete_or_absent(tmp_path, monkeypatch):
    """``prune --plain`` writes model/ and plain/ in one swap: a failure in plain/ leaves the old output whole."""
    from headwise.cli import output
    from headwise.report import Report

    model = tiny_model("llama")
    out = tmp_path / "out"
    output.save_run(out, model, None, "run.json", {"n": 1}, Report("t", "t"), plain=True)
    assert {p.name for p in out.iterdir()} == {"model", "plain", "run.json", "report.html", MANIFEST}
    transformers_model = __import__("transformers").AutoModel.from_pretrained(out / "plain")
    assert type(transformers_model).__name__ == "LlamaModel"

    def broken(model, path, tokenizer=None, overwrite=False):
        Path(path).mkdir()
        (Path(path) / "half").write_text("x")
        raise KeyboardInterrupt  # killed between model/ and plain/

    monkeypatch.setattr(__import__("headwise.io").io, "export_plain", broken)  # save_run imports it when called
    with pytest.raises(KeyboardInterrupt):
        output.save_run(out, model, None, "run.json", {"n": 2}, Report("t", "t"), overwrite=True, plain=True)
    assert (out / "run.json").read_text().strip() == '{\n "n": 1\n}' and (out / "plain" / "config.json").is_file()
    assert _leftovers(tmp_path) == []


def test_readers_of_a_folder_being_replaced_see_the_old_or_the_new_version(tmp_path):
    inputs, real = tiny_inputs("bert")
    models = [tiny_model("bert") for _ in range(2)]
    with torch.no_grad():
        outputs = [m(**inputs).last_hidden_state[real] for m in models]
    folder = tmp_path / "shared"
    headwise.save_pretrained(models[0], folder)
    errors, seen, done = [], set(), threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                with torch.no_grad():
                    out = headwise.from_pretrained(folder)(**inputs).last_hidden_state[real]
                seen.add(next(i for i, o in enumerate(outputs) if torch.equal(o, out)))
            except Exception as err:  # noqa: BLE001 - any error is the failure this test looks for
                errors.append(repr(err))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(40):
            headwise.save_pretrained(models[i % 2], folder, overwrite=True)
    finally:
        done.set()
        thread.join()
    assert errors == [] and seen, errors[:3]
    assert _leftovers(tmp_path) == []


def test_an_unwritable_cache_names_headwise_cache(tmp_path, monkeypatch):
    from headwise import models

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "file" / "cache"))
    (tmp_path / "model.gguf").write_bytes(b"GGUF")  # fingerprinted before anything is written
    monkeypatch.setattr(models.registry, "smollm2_gguf", lambda: tmp_path / "model.gguf")
    with pytest.raises(HeadwiseError, match="set HEADWISE_CACHE to a writable folder") as err:
        models.packaged_smollm2()
    assert len(str(err.value).splitlines()) == 1
