"""ONE long-lived QThread that owns the model and runs every MLX call.

Since mlx 0.31.2 streams belong to a thread: a model loaded on one thread fails on another. So every job —
loading included — runs here, in order. Jobs of a coalescing kind (slider moves) replace a pending job of the
same kind, and a result that a newer request of its kind has superseded is dropped, never emitted.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QThread, Signal

from kvcore.capture.prefill import Cancelled

log = logging.getLogger(__name__)


@dataclass
class JobContext:
    """What a job sees: engine-side state (lives on the engine thread only), progress and cancellation."""

    state: dict
    request_id: int
    kind: str
    _engine: EngineThread
    _cancel: threading.Event = field(default_factory=threading.Event)

    def progress(self, fraction: float, text: str = "") -> None:
        self._engine.progressed.emit(self.request_id, text, float(fraction))

    def publish(self, value: Any) -> None:
        """Hand a partial result to the GUI now (a sweep's finished point), while the job goes on."""
        self._engine.partialResult.emit(JobResult(self.request_id, self.kind, value, 0.0))

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check_cancelled(self) -> None:
        if self._cancel.is_set():
            raise Cancelled()


@dataclass(frozen=True)
class JobResult:
    request_id: int
    kind: str
    value: Any
    seconds: float


@dataclass(frozen=True)
class JobFailure:
    request_id: int
    kind: str
    message: str
    cancelled: bool = False


Job = Callable[[JobContext], Any]


class EngineThread(QThread):
    """Runs submitted jobs one at a time on a single thread; signals reach the GUI through queued connections."""

    resultReady = Signal(object)
    partialResult = Signal(object)  # JobResult of a value a running job published (JobContext.publish)
    failed = Signal(object)
    progressed = Signal(int, str, float)
    busyChanged = Signal(bool, str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("engineThread")
        self._cv = threading.Condition()
        self._pending: deque[tuple[int, str, Job]] = deque()
        self._latest: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._current: JobContext | None = None
        self._stopping = False
        self._state: dict = {}
        self.thread_ident: int | None = None

    def submit(self, kind: str, job: Job, coalesce: bool = False) -> int:
        """Queue `job`; with coalesce, a not-yet-started job of the same kind is replaced. Returns its id."""
        with self._cv:
            rid = next(self._ids)
            if coalesce:
                self._pending = deque(p for p in self._pending if p[1] != kind)
            self._pending.append((rid, kind, job))
            self._latest[kind] = rid
            self._cv.notify()
        return rid

    def latest_id(self, kind: str) -> int | None:
        with self._cv:
            return self._latest.get(kind)

    def is_current(self, request_id: int, kind: str) -> bool:
        return self.latest_id(kind) == request_id

    def cancel(self, kind: str | None = None) -> None:
        """Cancel the running job and drop every pending one; with `kind`, only jobs of that kind.

        Thread-safe: it only sets an event and edits the queue under the lock."""
        with self._cv:
            if kind is None:
                self._pending.clear()
            else:
                self._pending = deque(p for p in self._pending if p[1] != kind)
            if self._current is not None and kind in (None, self._current.kind):
                self._current._cancel.set()

    def shutdown(self, timeout_ms: int = 10000) -> None:
        with self._cv:
            self._stopping = True
            self._pending.clear()
            if self._current is not None:
                self._current._cancel.set()
            self._cv.notify()
        self.wait(timeout_ms)

    def run(self) -> None:
        self.thread_ident = threading.get_ident()
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                rid, kind, job = self._pending.popleft()
                ctx = JobContext(self._state, rid, kind, self)
                self._current = ctx
            self.busyChanged.emit(True, kind)
            start = time.perf_counter()
            try:
                value = job(ctx)
            except Cancelled:
                self.failed.emit(JobFailure(rid, kind, "Cancelled.", cancelled=True))
            except Exception as exc:  # every failure becomes a message, never a dead thread
                self.failed.emit(JobFailure(rid, kind, _message(exc)))
                log.debug("job %s failed", kind, exc_info=True)
            else:
                if self.is_current(rid, kind):
                    self.resultReady.emit(JobResult(rid, kind, value, time.perf_counter() - start))
            finally:
                with self._cv:
                    self._current = None
                    idle = not self._pending
                if idle:
                    self.busyChanged.emit(False, "")


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if len(text) < 400 else text[:400] + "…"
