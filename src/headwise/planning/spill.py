"""Storages set aside on disk while an edit is measured: a CPU storage's bytes are written to an anonymous temporary
file and its memory is freed by resizing the storage to 0 bytes, so every tensor over it keeps its identity (the
same ``Parameter`` objects, shapes and strides); ``reload`` reads the bytes back into the same storages. The pages
written sit in the page cache, which the system reclaims under pressure, where the storages' own pages could not be.
This is what lets a plan hold an edited model beside the original without holding both in memory
(``snapshot.AttentionSnapshot.offload_unused``)."""

from __future__ import annotations

import tempfile
import warnings
from typing import IO

import torch

from ..errors import HeadwiseError, HeadwiseNote
from ..io.files import deferred_interrupt


def storage_key(storage: torch.UntypedStorage) -> int:
    """The identity of a storage (its C object, which a resize keeps; an address does not identify it, since a
    freed address is handed out again)."""
    return storage._cdata


CHUNK = 1 << 24  # bytes copied through a buffer at a time (a storage shared with numpy can no longer be resized)


def _flat(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage's bytes as a ``uint8`` tensor over it (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))


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
            flat = _flat(storage)
            for start in range(0, size, CHUNK):
                self.file.write(flat[start:start + CHUNK].clone().numpy().data)  # through a copy of the chunk
            self.file.flush()
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
                flat = _flat(storage)
                buffer = bytearray(min(CHUNK, size))
                self.file.seek(offset)
                for start in range(0, size, CHUNK):
                    n = min(CHUNK, size - start)
                    if self.file.readinto(memoryview(buffer)[:n]) != n:
                        raise HeadwiseError("the plan's temporary file ended early while reading back a set-aside "
                                            "attention weight; the model is incomplete: load it again")
                    flat[start:start + n].copy_(torch.frombuffer(buffer, dtype=torch.uint8, count=n))
                del self.held[key]
            self.file.close()
            self.file = None
        if interrupted[0]:
            raise KeyboardInterrupt
