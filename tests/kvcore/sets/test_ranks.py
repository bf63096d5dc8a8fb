"""Ranks.gather_json: what a peer that died mid-send leaves in the ring is named as that rank's loss."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from kvcore.sets.ranks import RankLost, Ranks


def test_one_rank_gathers_its_own_value():
    ranks = Ranks()
    assert ranks.size == 1
    assert ranks.gather_json({"rows": [1, "é"]}) == [{"rows": [1, "é"]}]


def test_a_payload_that_is_not_json_names_the_rank_that_died(monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: the peer killed mid-send
    ranks = Ranks()
    host = socket.gethostname()
    ranks.peers = [{"pid": os.getpid(), "host": host}, {"pid": gone.pid, "host": host}]
    monkeypatch.setattr(ranks, "gather", lambda data: [data, b"\x98\x00{half"])
    with pytest.raises(RankLost, match=rf"rank 1 \(pid {gone.pid}\) exited before the prompt set was done"):
        ranks.gather_json({"rows": []})
    assert ranks.reported, "the launcher's later SIGTERM adds no second line"
