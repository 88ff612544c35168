"""Tensors set aside on disk, in anonymous temporary files whose pages sit in the page cache, which the system
reclaims under pressure, where the tensors' own pages could not be.

``Spill``: CPU storages set aside while an edit is measured: a storage's bytes are written to the file and its
memory is freed by resizing the storage to 0 bytes, so every tensor over it keeps its identity (the same
``Parameter`` objects, shapes and strides); ``reload`` reads the bytes back into the same storages. This is what
lets a plan hold an edited model beside the original without holding both in memory
(``planning.snapshot.AttentionSnapshot.offload_unused``).

``TensorFile``: copies of tensors written once and read back as new tensors (the layers' inputs that the
layer-by-layer gradient pass reads in reverse, ``analysis.layerwise``)."""

from __future__ import annotations

import math
import tempfile
import warnings
from typing import IO

import torch

from ..errors import HeadwiseError, HeadwiseNote
from .files import deferred_interrupt


def storage_key(storage: torch.UntypedStorage) -> int:
    """The identity of a storage (its C object, which a resize keeps; an address does not identify it, since a
    freed address is handed out again)."""
    return storage._cdata


CHUNK = 1 << 24  # bytes copied through a buffer at a time (a storage shared with numpy can no longer be resized)


def _flat(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage's bytes as a ``uint8`` tensor over it (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))


def _write(file: IO[bytes], flat: torch.Tensor) -> None:
    """Append the bytes of ``flat`` (``uint8``) to ``file``, a chunk at a time, through a copy of each chunk."""
    for start in range(0, flat.numel(), CHUNK):
        file.write(flat[start:start + CHUNK].clone().numpy().data)
    file.flush()


def _read(file: IO[bytes], offset: int, flat: torch.Tensor) -> bool:
    """Fill ``flat`` (``uint8``) from ``file`` at ``offset``, a chunk at a time; False when the file ends first."""
    size = flat.numel()
    buffer = bytearray(min(CHUNK, size))
    file.seek(offset)
    for start in range(0, size, CHUNK):
        n = min(CHUNK, size - start)
        if file.readinto(memoryview(buffer)[:n]) != n:
            return False
        flat[start:start + n].copy_(torch.frombuffer(buffer, dtype=torch.uint8, count=n))
    return True


class Spill:
    """CPU storages whose bytes are in a temporary file and whose memory is freed, until ``reload``."""

    def __init__(self) -> None:
        self.file: IO[bytes] | None = None
        self.held: dict[int, tuple[torch.UntypedStorage, int, int]] = {}  # key: (storage, offset, bytes)

    def __len__(self) -> int:
        return len(self.held)

    def __contains__(self, key: int) -> bool:
        return key in self.held

    def add(self, storage: torch.UntypedStorage) -> int:
        """Write ``storage`` to the file and free its memory; returns the bytes freed (0: not a CPU storage that
        can be resized, empty, or held already; or the write failed, which a ``HeadwiseNote`` says). The bytes are
        written in full before the memory is freed."""
        key = storage_key(storage)
        size = storage.nbytes()
        if key in self.held or size == 0 or storage.device.type != "cpu" or not storage.resizable():
            return 0
        offset = None
        try:
            if self.file is None:
                self.file = tempfile.TemporaryFile(prefix="headwise-spill-")
            offset = self.file.seek(0, 2)
            _write(self.file, _flat(storage))
        except OSError as err:
            if offset is not None:
                self.file.seek(offset)
            warnings.warn(f"could not set the model's replaced tensors aside on disk ({err}); they stay in memory",
                          HeadwiseNote, stacklevel=2)
            return 0
        self.held[key] = (storage, offset, size)
        storage.resize_(0)
        return size

    def reload(self) -> None:
        """Read every held storage back into its own memory and close the file. An interrupt (Ctrl-C) waits until
        every storage is back, then is raised."""
        if self.file is None:
            return
        with deferred_interrupt() as interrupted:
            for key, (storage, offset, size) in list(self.held.items()):
                storage.resize_(size)
                if not _read(self.file, offset, _flat(storage)):
                    raise HeadwiseError("the plan's temporary file ended early while reading back a set-aside "
                                        "attention weight; the model is incomplete: load it again")
                del self.held[key]
            self.file.close()
            self.file = None
        if interrupted[0]:
            raise KeyboardInterrupt


class TensorFile:
    """Copies of tensors in an anonymous temporary file: ``put(tensor)`` writes one (any device; its values, not
    its storage) and returns its index, ``get(index)`` reads it back as a new contiguous tensor on the device it
    came from, ``close()`` deletes the file. A write that fails (disk full) raises ``HeadwiseError``: a caller
    that cannot hold the tensors in memory has no other place for them."""

    def __init__(self, what: str) -> None:
        self.what = what  # what the tensors are, for the messages
        self.file: IO[bytes] | None = None
        self.entries: list[tuple[int, torch.Size, torch.dtype, torch.device]] = []

    def put(self, tensor: torch.Tensor) -> int:
        copy = tensor.detach().to("cpu").contiguous()
        try:
            if self.file is None:
                self.file = tempfile.TemporaryFile(prefix="headwise-tensors-")
            offset = self.file.seek(0, 2)
            if copy.numel():
                _write(self.file, copy.view(-1).view(torch.uint8))
        except OSError as err:
            raise HeadwiseError(f"could not write {self.what} to a temporary file ({err}); free disk space in "
                                f"{tempfile.gettempdir()} or point TMPDIR at a folder with room") from err
        self.entries.append((offset, tensor.shape, tensor.dtype, tensor.device))
        return len(self.entries) - 1

    def get(self, index: int, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """Tensor ``index``, or (``start``/``stop`` given) its entries ``start:stop`` along dimension 1 (``[B,
        stop − start, ...]``, one read per row of dimension 0)."""
        offset, shape, dtype, device = self.entries[index]
        if start is None and stop is None:
            out = torch.empty(shape, dtype=dtype)
            reads = [(offset, out.view(-1))]
        else:
            start, stop = max(0, start or 0), min(shape[1], shape[1] if stop is None else stop)
            out = torch.empty(shape[0], max(0, stop - start), *shape[2:], dtype=dtype)
            row = math.prod(shape[2:]) * out.element_size()  # the bytes of one entry along dimension 1
            reads = [(offset + (b * shape[1] + start) * row, out[b].view(-1)) for b in range(shape[0])]
        for at, values in reads:
            if values.numel() and (self.file is None or not _read(self.file, at, values.view(torch.uint8))):
                raise HeadwiseError(f"the temporary file of {self.what} ended early; run again")
        return out.to(device)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file, self.entries = None, []
