"""Per-client state vectors (the memories v_i of Fed-α-NormEC), stored so a round touches only its rows.

Up to ``DENSE_LIMIT`` bytes the n rows are one tensor on the model's device. Beyond that they live in
a temporary file on disk: a sparse file, so rows never written take no disk and read as zeros
(v_i^0 = 0), and a round reads and writes back only the rows of the clients it computes, so only
those are in RAM. The file is deleted when the run ends. With 100,000 clients and participation p,
a round then costs what its cohort costs, whatever the population.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import torch

DENSE_LIMIT = 2 * 2**30          # bytes: above this, rows go to a file on disk


class ClientMemory:
    """n vectors of size d, all zero at the start; ``ids`` are a 1-D LongTensor, or None for all."""

    def __init__(self, n: int, d: int, device, dtype: torch.dtype):
        self.n, self.d, self.device, self.dtype = n, d, device, dtype
        self.np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        self.row_bytes = d * self.np_dtype.itemsize
        if n * self.row_bytes <= DENSE_LIMIT:
            self.rows, self.file = torch.zeros(n, d, device=device, dtype=dtype), None
        else:
            self._open_file()
        self.touched: set[int] = set()                      # rows ever written (what a checkpoint keeps)

    def _open_file(self) -> None:
        self.rows, self.file = None, tempfile.TemporaryFile(prefix="normfl-client-memory-")
        os.ftruncate(self.file.fileno(), self.n * self.row_bytes)       # sparse: reads as zeros

    def __getstate__(self) -> dict:
        """For a checkpoint: a copy of the dense rows (those of a run side by side are a view of its group's), or
        only the rows ever written when on disk."""
        state = {k: v for k, v in vars(self).items() if k != "file"}
        if not self.on_disk:
            state["rows"] = self.rows.detach().clone()
        else:
            ids = torch.tensor(sorted(self.touched), dtype=torch.long)
            state["written"] = (ids, self[ids].cpu())
        return state

    def __setstate__(self, state: dict) -> None:
        written = state.pop("written", None)
        vars(self).update(state, file=None)
        if written is not None:
            self._open_file()
            ids, rows = written
            self._write(ids, rows.numpy())

    def to(self, device) -> ClientMemory:
        """The memories on ``device`` (rows in RAM move; rows on disk are read onto it as they are read)."""
        self.device = torch.device(device)
        if self.rows is not None:
            self.rows = self.rows.to(self.device)
        return self

    @property
    def on_disk(self) -> bool:
        return self.file is not None

    def _read_into(self, out: np.ndarray, start: int) -> np.ndarray:
        """Rows start, start+1, ... of the file straight into ``out`` (one copy, from the page cache)."""
        if os.preadv(self.file.fileno(), [out], start * self.row_bytes) != out.nbytes:
            raise OSError(f"short read of client memory rows from {start}")
        return out

    def __getitem__(self, ids) -> torch.Tensor:
        """The rows of ``ids`` (1-D LongTensor), or all rows (None)."""
        if not self.on_disk:
            return self.rows if ids is None else self.rows[ids.to(self.device, non_blocking=True)]
        ids = torch.arange(self.n) if ids is None else ids
        out = np.empty((len(ids), self.d), self.np_dtype)
        for row, i in zip(out, ids.tolist(), strict=True):
            self._read_into(row, i)
        return torch.from_numpy(out).to(self.device)

    def __setitem__(self, ids, rows: torch.Tensor) -> None:
        """v_i = the given row, for the clients ``ids`` (distinct), or for all (None)."""
        if not self.on_disk:
            if ids is None:
                self.rows.copy_(rows)
            else:
                self.rows[ids.to(self.device, non_blocking=True)] = rows
            return
        self._write(torch.arange(self.n) if ids is None else ids, rows.detach().cpu().numpy())

    def _write(self, ids: torch.Tensor, rows: np.ndarray) -> None:
        for i, row in zip(ids.tolist(), np.ascontiguousarray(rows), strict=True):
            os.pwrite(self.file.fileno(), row, i * self.row_bytes)
        self.touched.update(ids.tolist())

    def mean(self) -> torch.Tensor:
        """(1/n) Σ_i v_i (read in chunks of at most 256 MiB when on disk)."""
        if not self.on_disk:
            return self.rows.mean(0)
        chunk = max(1, 2**28 // self.row_bytes)
        total = torch.zeros(self.d, dtype=torch.float64)
        for s in range(0, self.n, chunk):
            rows = self._read_into(np.empty((min(chunk, self.n - s), self.d), self.np_dtype), s)
            total += torch.from_numpy(rows).sum(0, dtype=torch.float64)
        return (total / self.n).to(self.device, self.dtype)
