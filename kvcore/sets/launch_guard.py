"""A rank of `mlx.launch` must not outlive its launch, nor die without saying why.

mlx.launch 0.32 stops every other rank with SIGTERM when one exits non-zero, and itself exits 0 with only a
warning; a rank whose launcher was killed waits in its next collective forever. So each rank of a launch of
several exits when its parent (the launcher) is gone, and rank 0, stopped by SIGTERM before its work is done,
writes one `kvlens: error:` line naming the rank that died and exits 1 at once, even while its main thread is
blocked in a collective (the other ranks, and rank 0 once done, stop on SIGTERM as before).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

#: How often a rank checks that its launcher is still there (seconds).
PARENT_POLL_S = 1.0


def guard(ranks: Any) -> None:
    """Watch the launcher and SIGTERM for this rank (call from the main thread, once)."""
    _exit_with_parent()
    if threading.current_thread() is threading.main_thread():
        _report_sigterm(ranks)


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if (
                os.getppid() != parent
            ):  # re-parented: the launcher is gone, no one will read what this rank does
                os._exit(1)

    threading.Thread(target=watch, name="kvlens-launcher-watch", daemon=True).start()


def _report_sigterm(ranks: Any) -> None:
    """SIGTERM's C-level handler writes its number to a pipe at once (signal.set_wakeup_fd); a thread reads it,
    so the report does not wait for a main thread blocked in MLX."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def wait() -> None:
        while os.read(read_end, 1) != bytes([signal.SIGTERM]):
            pass
        if ranks.reported:  # the main thread named the lost rank already
            os._exit(1)
        if ranks.rank == 0 and not ranks.finished:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"\nkvlens: error: {ranks.lost()}\n")
                sys.stderr.flush()
            os._exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # another rank, or the work done: stopped as before
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="kvlens-sigterm", daemon=True).start()
