"""ONE long-lived QThread that owns the model and runs every MLX call.

Since mlx 0.31.2 streams belong to a thread: a model loaded on one thread fails on another. So every job —
loading included — runs here, in order. Jobs of a coalescing kind (slider moves) replace a pending job of the
same kind, and a result that a newer request of its kind has superseded is dropped, never emitted.

Whoever submits a job hands it the callbacks for its result, its failure and its published partial results; they
run on the GUI thread, so no one dispatches on a job's kind.
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

#: How long a quit waits for the running job to notice its cancellation (a prefill or sweep checks every step);
#: a job that does not (a model load) is abandoned, so quitting takes well under 2 s.
QUIT_WAIT_MS = 500
#: Engine threads a quit left running: kept here so that no one destroys a QThread while it runs.
_ABANDONED: list[EngineThread] = []


def abandoned_running() -> bool:
    """Whether a quit left an engine thread running a job it could not interrupt: the process then ends
    without waiting for it (app.gui)."""
    return any(t.isRunning() for t in _ABANDONED)


@dataclass(frozen=True)
class Callbacks:
    """What the submitter runs, on the GUI thread, when its job publishes, finishes or fails."""

    on_result: Callable[[JobResult], None] | None = None
    on_failure: Callable[[JobFailure], None] | None = None
    on_partial: Callable[[JobResult], None] | None = None


class EngineThread(QThread):
    """Runs submitted jobs one at a time on a single thread; signals reach the GUI through queued connections."""

    resultReady = Signal(object)
    partialResult = Signal(object)  # JobResult of a value a running job published (JobContext.publish)
    failed = Signal(object)
    progressed = Signal(int, str, float)
    busyChanged = Signal(bool, str)
    _discarded = Signal(int)  # a finished job whose result a newer request superseded: forget its callbacks

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
        self._callbacks: dict[int, Callbacks] = {}
        self.thread_ident: int | None = None
        # Queued connections (this object lives on the GUI thread): the callbacks run there, in emission order.
        self.resultReady.connect(self._deliver_result)
        self.failed.connect(self._deliver_failure)
        self.partialResult.connect(self._deliver_partial)
        self._discarded.connect(self._forget)

    def submit(
        self,
        kind: str,
        job: Job,
        coalesce: bool = False,
        on_result: Callable[[JobResult], None] | None = None,
        on_failure: Callable[[JobFailure], None] | None = None,
        on_partial: Callable[[JobResult], None] | None = None,
    ) -> int:
        """Queue `job`; with coalesce, a not-yet-started job of the same kind is replaced. Returns its id.

        on_result gets its result while it is the newest of its kind, on_failure its failure or cancellation,
        on_partial what it publishes; all on the GUI thread. A job dropped before it starts calls none."""
        with self._cv:
            rid = next(self._ids)
            if coalesce:
                self._drop_pending(lambda p: p[1] == kind)
            self._pending.append((rid, kind, job))
            if on_result or on_failure or on_partial:
                self._callbacks[rid] = Callbacks(on_result, on_failure, on_partial)
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
            self._drop_pending(lambda p: kind is None or p[1] == kind)
            if self._current is not None and kind in (None, self._current.kind):
                self._current._cancel.set()

    def shutdown(self, timeout_ms: int = QUIT_WAIT_MS) -> bool:
        """Stop for good: drop every pending job and its callbacks, cancel the running one and wait up to
        `timeout_ms` for it. True when the thread ended. A job that cannot be interrupted (a model load) is
        abandoned instead: the thread is detached — no parent, held by this module, so nothing destroys it
        while it runs — and ends by itself when the job returns; `abandoned_running` tells the caller."""
        with self._cv:
            self._stopping = True
            self._drop_pending(lambda p: True)
            self._callbacks.clear()  # a job ending after the quit reaches no window
            if self._current is not None:
                self._current._cancel.set()
            self._cv.notify()
        if self.wait(timeout_ms):
            return True
        self.setParent(None)
        _ABANDONED.append(self)
        current = self._current
        log.info("quit: abandoned the running %s job", current.kind if current is not None else "engine")
        return False

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
                else:
                    self._discarded.emit(rid)
            finally:
                with self._cv:
                    self._current = None
                    idle = not self._pending
                if idle:
                    self.busyChanged.emit(False, "")

    def _drop_pending(self, drop: Callable[[tuple[int, str, Job]], bool]) -> None:
        """Remove the pending jobs `drop` picks, and their callbacks (call with the lock held)."""
        kept: deque[tuple[int, str, Job]] = deque()
        for entry in self._pending:
            if drop(entry):
                self._callbacks.pop(entry[0], None)
            else:
                kept.append(entry)
        self._pending = kept

    # -- the GUI side: each job's own callbacks -------------------------------------------------------

    def _take(self, request_id: int) -> Callbacks | None:
        with self._cv:
            return self._callbacks.pop(request_id, None)

    def _forget(self, request_id: int) -> None:
        self._take(request_id)

    def _deliver_result(self, result: JobResult) -> None:
        callbacks = self._take(result.request_id)
        if callbacks and callbacks.on_result and self.is_current(result.request_id, result.kind):
            callbacks.on_result(result)

    def _deliver_failure(self, failure: JobFailure) -> None:
        callbacks = self._take(failure.request_id)
        if callbacks and callbacks.on_failure:
            callbacks.on_failure(failure)

    def _deliver_partial(self, result: JobResult) -> None:
        with self._cv:
            callbacks = self._callbacks.get(result.request_id)
        if callbacks and callbacks.on_partial:
            callbacks.on_partial(result)


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if len(text) < 400 else text[:400] + "…"
