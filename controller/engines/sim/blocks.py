"""The KV block pool: fixed-size blocks of KV cache handed out by integer id."""

from __future__ import annotations


class BlockPool:
    """``capacity`` blocks; ids are ints handed out lazily so a large pool costs no memory."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[int] = []  # returned ids, reused first
        self._next = 0  # ids >= this were never handed out
        self.used = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def usage(self) -> float:
        """Used share of the pool, 0..1."""
        return self.used / self.capacity if self.capacity else 0.0

    def take(self, n: int) -> list[int]:
        """``n`` block ids; the caller checks ``free`` first."""
        if n > self.free:
            raise ValueError(f"asked for {n} blocks, {self.free} free")
        reused = min(n, len(self._free))
        ids = self._free[len(self._free) - reused:]
        del self._free[len(self._free) - reused:]
        fresh = n - reused
        ids.extend(range(self._next, self._next + fresh))
        self._next += fresh
        self.used += n
        return ids

    def give_back(self, ids: list[int]) -> None:
        self._free.extend(ids)
        self.used -= len(ids)
