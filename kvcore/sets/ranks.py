"""The one collective a prompt-set run needs: every rank hands in some bytes and every rank gets everyone's.

Built on `mx.distributed.all_gather` (ring over Ethernet / Thunderbolt, or MPI, as `mlx.launch` sets it up): first
the lengths, then the payloads padded to the longest, as uint8 arrays. Payloads are JSON text (no pickle: a rank
never runs what another sends). Outside `mlx.launch`, `mx.distributed.init()` is a group of one and nothing moves.

Under a launch of several ranks, each rank also watches the launch (kvcore.sets.launch_guard): it exits when the
launcher dies, and when the launcher stops it because a rank died, rank 0 names that rank in one error line.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import numpy as np

#: A gathered length above this is not a payload but what a collective reads from a peer that died mid-send.
MAX_GATHER_BYTES = 1 << 34


class RankLost(ValueError):
    """A collective failed: another rank died or the network between them dropped."""


class Ranks:
    """This process's place in the launch (rank, size) and an all-gather of bytes, counting what moved."""

    def __init__(self) -> None:
        import mlx.core as mx

        self._mx = mx
        self.group = mx.distributed.init()
        self.rank, self.size = self.group.rank(), self.group.size()
        self.bytes_moved = 0  # bytes all ranks together sent to the others (padding and lengths included)
        self.gathers = 0
        self.peers: list[dict] = []  # every rank's {"pid", "host"}: which one died, when one does
        self.finished = False  # set once the work and the files are done: a SIGTERM then is no loss
        self.reported = (
            False  # set once a lost rank was named: the launcher's SIGTERM then adds no second line
        )
        if self.size > 1:
            from kvcore.sets.launch_guard import guard

            me = {"pid": os.getpid(), "host": socket.gethostname()}
            found, _ = self._all_gather(json.dumps(me).encode("utf-8"))
            self.peers = [json.loads(p) for p in found]
            guard(self)

    def gather(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order (a collective: every rank must call it the same number of times)."""
        if self.size == 1:
            return [data]
        out, width = self._all_gather(data)
        self.bytes_moved += (width + 8) * self.size * (self.size - 1)
        self.gathers += 1
        return out

    def gather_json(self, value: Any) -> list[Any]:
        """Every rank's `value` (JSON-encodable), decoded, in rank order. A payload that is not UTF-8 JSON is what
        a peer that died mid-send leaves in the ring: RankLost, naming the rank, as a failed collective."""
        parts = self.gather(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        try:
            return [json.loads(p.decode("utf-8")) for p in parts]
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.reported = True
            raise RankLost(self.lost()) from None

    def _all_gather(self, data: bytes) -> tuple[list[bytes], int]:
        mx = self._mx
        try:
            lengths = mx.distributed.all_gather(mx.array([len(data)], dtype=mx.int64), group=self.group)
            lengths = [int(n) for n in np.array(lengths)]
            if min(lengths) < 0 or max(lengths) > MAX_GATHER_BYTES:
                raise RuntimeError(f"a rank sent a length of {max(lengths)} bytes")
            width = max(max(lengths), 1)
            padded = np.zeros(width, dtype=np.uint8)
            padded[: len(data)] = np.frombuffer(data, dtype=np.uint8)
            out = np.array(mx.distributed.all_gather(mx.array(padded), group=self.group)).reshape(
                self.size, width
            )
        except (RuntimeError, MemoryError):
            self.reported = True
            raise RankLost(self.lost()) from None
        return [out[r, : lengths[r]].tobytes() for r in range(self.size)], width

    def dead(self) -> list[int]:
        """The ranks on this machine whose process is gone (another machine's cannot be seen from here)."""
        host = socket.gethostname()
        gone = []
        for r, peer in enumerate(self.peers):
            if r == self.rank or peer.get("host") != host:
                continue
            try:
                os.kill(int(peer["pid"]), 0)
            except ProcessLookupError:
                gone.append(r)
            except (OSError, ValueError, TypeError):
                pass
        return gone

    def lost(self) -> str:
        """Which rank died, as far as this machine can tell, and what to do."""
        gone = self.dead()
        if gone:
            who = ", ".join(f"rank {r} (pid {self.peers[r]['pid']})" for r in gone)
            what = f"{who} exited before the prompt set was done"
        else:
            what = "another rank exited or mlx.launch stopped the run before the prompt set was done"
        return f"{what}; the finished rounds are in --csv: rerun the same command with --resume"
