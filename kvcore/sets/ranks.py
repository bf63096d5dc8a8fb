"""The one collective a prompt-set run needs: every rank hands in some bytes and every rank gets everyone's.

Built on `mx.distributed.all_gather` (ring over Ethernet / Thunderbolt, or MPI, as `mlx.launch` sets it up): first
the lengths, then the payloads padded to the longest, as uint8 arrays. Payloads are JSON text (no pickle: a rank
never runs what another sends). Outside `mlx.launch`, `mx.distributed.init()` is a group of one and nothing moves.
"""

from __future__ import annotations

import numpy as np


class Ranks:
    """This process's place in the launch (rank, size) and an all-gather of bytes, counting what moved."""

    def __init__(self) -> None:
        import mlx.core as mx

        self._mx = mx
        self.group = mx.distributed.init()
        self.rank, self.size = self.group.rank(), self.group.size()
        self.bytes_moved = 0  # bytes all ranks together sent to the others (padding and lengths included)
        self.gathers = 0

    def gather(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order (a collective: every rank must call it the same number of times)."""
        if self.size == 1:
            return [data]
        mx = self._mx
        lengths = mx.distributed.all_gather(mx.array([len(data)], dtype=mx.int64), group=self.group)
        lengths = [int(n) for n in np.array(lengths)]
        width = max(max(lengths), 1)
        padded = np.zeros(width, dtype=np.uint8)
        padded[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        out = np.array(mx.distributed.all_gather(mx.array(padded), group=self.group)).reshape(
            self.size, width
        )
        self.bytes_moved += (width + 8) * self.size * (self.size - 1)
        self.gathers += 1
        return [out[r, : lengths[r]].tobytes() for r in range(self.size)]
