"""Tensors set aside on disk (``headwise.io.spill``): ``Spill``'s bytes come back exactly into the same storages,
and whatever cannot be set aside is left alone; ``TensorFile``'s copies come back equal, or a failure says so."""

import pytest
import torch

from headwise.errors import HeadwiseError, HeadwiseNote
from headwise.io import spill as spill_module
from headwise.io.spill import Spill, TensorFile, storage_key


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_storages_come_back_bit_for_bit_into_the_same_objects(dtype, monkeypatch):
    monkeypatch.setattr(spill_module, "CHUNK", 1000)  # several chunks a storage
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(37, 101, dtype=dtype))
    view = weight.detach()[3:9, ::2]  # a strided view keeps its meaning
    small = torch.randn(3, dtype=dtype)
    before = [weight.detach().clone(), view.clone(), small.clone()]
    key = storage_key(weight.untyped_storage())
    spill = Spill()
    assert spill.add(weight.untyped_storage()) == weight.numel() * weight.element_size()
    assert spill.add(small.untyped_storage()) == 3 * small.element_size()
    assert spill.add(weight.untyped_storage()) == 0  # held already
    assert weight.untyped_storage().nbytes() == 0 and key in spill and len(spill) == 2
    spill.reload()
    assert [torch.equal(a, b) for a, b in zip([weight.detach(), view, small], before)] == [True] * 3
    assert storage_key(weight.untyped_storage()) == key and len(spill) == 0 and spill.file is None


def test_what_cannot_be_set_aside_is_left_alone():
    import numpy as np

    spill = Spill()
    shared = torch.from_numpy(np.arange(6, dtype=np.float32))  # numpy owns the memory: not resizable
    assert spill.add(shared.untyped_storage()) == 0 and shared.tolist() == [0, 1, 2, 3, 4, 5]
    assert spill.add(torch.empty(0).untyped_storage()) == 0
    assert spill.add(torch.empty(4, device="meta").untyped_storage()) == 0
    assert len(spill) == 0


def test_a_failed_write_keeps_the_tensor_in_memory_with_a_note(monkeypatch):
    spill = Spill()
    kept = torch.arange(8.0)
    assert spill.add(kept.untyped_storage()) == 32  # the file exists now
    spill.reload()
    spill.add(kept.untyped_storage())

    class Full:
        def __init__(self, file):
            self.file = file

        def write(self, data):
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.file, name)

    spill.file = Full(spill.file)
    other = torch.arange(5.0)
    with pytest.warns(HeadwiseNote, match="No space left on device"):
        assert spill.add(other.untyped_storage()) == 0
    assert other.tolist() == [0, 1, 2, 3, 4] and len(spill) == 1
    spill.file = spill.file.file
    spill.reload()
    assert kept.tolist() == list(map(float, range(8)))


def test_an_unwritable_temporary_folder_keeps_the_tensor_in_memory_with_a_note(monkeypatch):
    import tempfile

    def refused(**kwargs):
        raise PermissionError(13, "Permission denied", "/tmp")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    kept = torch.arange(4.0)
    with pytest.warns(HeadwiseNote, match="Permission denied"):
        assert Spill().add(kept.untyped_storage()) == 0
    assert kept.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_short_file_is_refused_loudly():
    spill = Spill()
    t = torch.arange(10.0)
    spill.add(t.untyped_storage())
    spill.file.truncate(8)
    with pytest.raises(HeadwiseError, match="ended early"):
        spill.reload()


def test_an_interrupt_while_reading_back_waits_until_every_storage_is_back(monkeypatch):
    import os
    import signal

    spill = Spill()
    tensors = [torch.arange(float(n)) for n in (10, 20, 30)]
    for t in tensors:
        spill.add(t.untyped_storage())
    frombuffer = torch.frombuffer
    calls = []

    def interrupted(*args, **kwargs):
        if not calls:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C after the first chunk
        calls.append(1)
        return frombuffer(*args, **kwargs)

    monkeypatch.setattr(torch, "frombuffer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        spill.reload()
    assert len(calls) == 3 and [t.tolist() for t in tensors] == [list(map(float, range(n))) for n in (10, 20, 30)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_tensor_file_gives_back_equal_copies_in_any_order(dtype, monkeypatch):
    monkeypatch.setattr(spill_module, "CHUNK", 100)  # several chunks a tensor
    torch.manual_seed(0)
    tensors = [torch.randn(2, 37, 5, dtype=dtype), torch.randn(7, 9, dtype=dtype).t(), torch.empty(0, 3, dtype=dtype)]
    store = TensorFile("test tensors")
    slots = [store.put(t) for t in tensors]
    before = tensors[0].clone()
    tensors[0].zero_()  # the file holds a copy: later writes to the tensor do not reach it
    back = [store.get(i) for i in reversed(slots)][::-1]
    assert [b.shape for b in back] == [t.shape for t in tensors] and all(b.dtype == dtype for b in back)
    assert torch.equal(back[0], before) and torch.equal(back[1], tensors[1]) and back[2].numel() == 0
    for start, stop in ((0, 37), (5, 12), (36, 40), (9, 9)):  # rows along dimension 1, one read per batch row
        assert torch.equal(store.get(slots[0], start, stop), before[:, start:stop])
    store.close()
    assert store.file is None


def test_a_tensor_file_that_cannot_be_written_or_ends_early_says_so(monkeypatch):
    import tempfile

    store = TensorFile("the layers' hidden states")
    store.put(torch.arange(10.0))
    store.file.truncate(8)
    with pytest.raises(HeadwiseError, match="hidden states ended early"):
        store.get(0)

    def refused(**kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    with pytest.raises(HeadwiseError, match="No space left on device.*TMPDIR"):
        TensorFile("the layers' hidden states").put(torch.arange(3.0))
