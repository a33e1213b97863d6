"""The program's constant pool: every distinct constant stored once in the CNST section.

Constants belong to the program, not to a function: the IR's ``mcp.constant`` ops (in any
function of the module) are references into one pool, and two with the same content — dtype,
shape and bytes — get the same DRAM address.  Several entry points over shared weights (or a tied
embedding used as a table and as a matmul weight) therefore cost their bytes once.

Lookup is by content hash (dtype, shape, BLAKE2b of the bytes); a hash match is confirmed by
comparing the bytes, so a collision can never alias two different tensors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from mcpc.arch.dtypes import to_storage


def content_key(arr: np.ndarray) -> tuple:
    """The pool key of ``arr``: dtype, shape and a 128-bit hash of its C-order bytes."""
    raw = np.ascontiguousarray(arr).tobytes()
    return (arr.dtype.str, tuple(arr.shape), hashlib.blake2b(raw, digest_size=16).digest())


@dataclass
class PoolEntry:
    """One stored constant: its array, offset and stored size in the CNST blob (sub-byte types
    packed, ``mcpc.arch.dtypes.to_storage``), and the names of its users."""

    array: np.ndarray
    offset: int
    size: int
    users: list[str] = field(default_factory=list)


@dataclass
class ConstantPool:
    """Constants packed into one blob, each ``align``-ed, in first-use order, each content once.

    Guarantees: ``add`` returns the same offset for arrays equal in dtype, shape and bytes, and
    distinct offsets (non-overlapping byte ranges) otherwise; ``blob()`` holds every entry's bytes
    at its offset and is padded to a multiple of ``align``.
    """

    align: int = 64
    entries: list[PoolEntry] = field(default_factory=list)
    _by_key: dict[tuple, list[PoolEntry]] = field(default_factory=dict)
    _data: bytearray = field(default_factory=bytearray)

    def add(self, arr: np.ndarray, user: str) -> int:
        """The CNST offset of ``arr`` (stored now unless an equal constant is stored already)."""
        arr = np.ascontiguousarray(arr)
        key = content_key(arr)
        for entry in self._by_key.get(key, []):
            if entry.array.tobytes() == arr.tobytes():  # the hash matched: confirm the bytes
                entry.users.append(user)
                return entry.offset
        self._data.extend(bytes(-len(self._data) % self.align))
        raw = to_storage(arr)
        entry = PoolEntry(arr, len(self._data), len(raw), [user])
        self._data.extend(raw)
        self.entries.append(entry)
        self._by_key.setdefault(key, []).append(entry)
        return entry.offset

    @property
    def references(self) -> int:
        """How many constants were added (every user), against ``len(entries)`` stored."""
        return sum(len(e.users) for e in self.entries)

    def blob(self) -> bytes:
        """The CNST section: every entry at its offset, padded to a multiple of ``align``."""
        return bytes(self._data) + bytes(-len(self._data) % self.align)
