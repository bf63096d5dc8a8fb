"""The jobs the window submits to the engine thread. Each runs there, and only there, touches the Session.

A job is built on the GUI thread from plain values (a path, a prompt, a config dict) and returns plain values
(app.engine.view_model), so no MLX object ever crosses threads. The Session lives in `ctx.state["session"]` and is
replaced only when a load succeeds, so a failed load or prefill leaves the user's session as it was.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from app.engine.thread import Job, JobContext
from app.engine.view_model import CompressionView, LoadedModel, SequenceView, compression_view, sequence_view
from kvcore.capture.prefill import Cancelled
from kvcore.defaults import DEFAULT_ANSWER_TOKENS
from kvcore.engine.questions import Question
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.sweep import SweepPoint, run_sweep
from kvcore.probes.needle_grid import GridCell, run_grid

SESSION = "session"
#: Generate N runs in about this many steps, so it can say "k of N" and a cancel keeps the steps done.
EXTEND_CHUNKS = 16

#: How the window's refusals name its opt-in to generate past the trained context (the CLI's is --beyond-context).
PAST_CONTEXT_FIX = (
    "or tick 'Past trained context' under Generate to go past it on purpose (RoPE extrapolates; the quality "
    "past the trained context is yours to judge)"
)

#: The kinds of job (EngineThread.submit): one job of a kind runs at a time, a newer one supersedes the older.
LOAD, PREFILL, EXTEND, COMPRESS, SWEEP, NEEDLES = "load", "prefill", "extend", "compress", "sweep", "needles"


def _session(ctx: JobContext) -> Session:
    session = ctx.state.get(SESSION)
    if session is None:
        raise ValueError("no model is loaded: load a model first")
    return session


def load(spec: str) -> Job:
    """Load a model; the previous session stays if this fails or is cancelled."""

    def job(ctx: JobContext) -> LoadedModel:
        ctx.progress(0.0, f"Loading {spec}…")
        session = Session.load(spec)
        ctx.check_cancelled()
        ctx.state[SESSION] = session
        return LoadedModel(spec, session.info)

    return job


def prefill_progress_text(done: int, total: int, elapsed_s: float) -> str:
    """ "Prefill 2,048/32,768 tokens · 1,234 tok/s · 25 s left": the rate so far and the time the rest takes at it."""
    text = f"Prefill {done:,}/{total:,} tokens"
    if done <= 0 or elapsed_s <= 0:
        return text
    rate = done / elapsed_s
    left = max(total - done, 0) / rate
    return (
        f"{text} · {rate:,.0f} tok/s · {left:,.0f} s left" if done < total else f"{text} · {rate:,.0f} tok/s"
    )


def _check_context(session: Session, held: str, used: int, n: int, fit: str) -> None:
    """ValueError naming `fit` and the window's opt-in when `used` positions plus n generated pass the model's
    trained context (max_position_embeddings)."""
    limit = session.info.max_context
    if limit is not None and used + n > limit:
        raise ValueError(
            f"{held} and {n} more would be generated, but the model's context is {limit} "
            f"(max_position_embeddings): {fit}, {PAST_CONTEXT_FIX}"
        )


def prefill(
    prompt: str,
    n_tokens: int,
    chat_template: bool = True,
    system_prompt: str | None = None,
    beyond_context: bool = False,
) -> Job:
    """Prefill with capture and compute the dense continuation (the baseline every setting is measured on);
    the chat template applies when asked and the tokenizer has one (kvcore.model.prompting). Past the trained
    context only with `beyond_context`; the refusal names the window's box, not the CLI's flag."""

    def job(ctx: JobContext) -> SequenceView:
        session = _session(ctx)
        start = time.perf_counter()

        def progress(done: int, total: int) -> None:
            text = prefill_progress_text(done, total, time.perf_counter() - start)
            ctx.progress(done / max(total, 1), text)

        if not beyond_context:
            n_prompt = len(session.encode(prompt, chat_template, system_prompt))
            over = n_prompt + n_tokens - (session.info.max_context or 0)
            fit = f"shorten the prompt by {over} tokens"
            _check_context(session, f"the prompt has {n_prompt} tokens", n_prompt, n_tokens, fit)
        session.prefill(
            prompt,
            n_tokens=n_tokens,
            on_progress=progress,
            should_cancel=ctx.cancelled,
            chat_template=chat_template,
            system_prompt=system_prompt,
            beyond_context=beyond_context,
        )
        return sequence_view(session)

    return job


def extend(n: int, beyond_context: bool = False) -> Job:
    """Continue the dense greedy continuation by n tokens (Step = 1, Generate N = n); None when nothing is
    prefilled. Past the trained context only with `beyond_context`."""

    def job(ctx: JobContext) -> SequenceView | None:
        session = _session(ctx)
        if not session.prompt_ids:  # the prefill it followed was cancelled or failed: nothing to extend
            return None
        if not beyond_context:
            used = session.positions_used
            room = (session.info.max_context or 0) - used
            fit = f"generate at most {room} tokens" if room > 0 else "prefill a shorter prompt"
            _check_context(session, f"the prompt and its continuation hold {used} positions", used, n, fit)
        done, chunk = 0, max(1, math.ceil(n / EXTEND_CHUNKS))
        while done < n:
            ctx.progress(done / n, f"Generating: {done} of {n} token{'s' if n != 1 else ''}")
            step = min(chunk, n - done)
            try:
                session.extend(step, should_cancel=ctx.cancelled)
            except Cancelled:
                if done == 0:
                    raise
                return dataclasses.replace(sequence_view(session), cut_short=True)
            done += step
            if done < n and ctx.cancelled():
                return dataclasses.replace(sequence_view(session), cut_short=True)
        return sequence_view(session)

    return job


def compress(
    config: dict[str, Any], regenerate: bool, is_current: Callable[[int], bool] | None = None
) -> Job:
    """Compress the prefilled cache with `config` and, if asked, regenerate. None when nothing is prefilled
    or when a newer request made this one stale (`is_current(request_id)` False): a drag then never waits
    for a regeneration nobody will see."""

    def job(ctx: JobContext) -> CompressionView | None:
        cfg = CompressionConfig.from_dict(config)
        session = ctx.state.get(SESSION)
        if session is None or not session.prompt_ids:
            return None

        def stale() -> bool:
            return is_current is not None and not is_current(ctx.request_id)

        state = session.compress(cfg)
        regen = None
        if regenerate:
            if stale():
                return None
            ctx.check_cancelled()
            try:
                regen = session.regenerate(state, should_cancel=lambda: ctx.cancelled() or stale())
            except Cancelled:
                if stale() and not ctx.cancelled():
                    return None
                raise
        view = compression_view(session, state, regen)
        view.request_id = ctx.request_id
        return view

    return job


def sweep(
    configs: list[dict[str, Any]],
    questions: Sequence[Question] = (),
    answer_tokens: int = DEFAULT_ANSWER_TOKENS,
) -> Job:
    """Run a sweep over the current prefill, publishing each finished point (kvcore.engine.sweep.SweepPoint) at once;
    returns them all. Cancel keeps what was published (the job then ends as cancelled). With `questions` every
    point also has their accuracy (query-agnostic: the prefill is their context)."""

    def job(ctx: JobContext) -> list[SweepPoint]:
        session = _session(ctx)
        cfgs = [CompressionConfig.from_dict(c) for c in configs]

        def progress(done: int, total: int, point: SweepPoint) -> None:
            ctx.progress(
                done / total, f"Sweep {done}/{total}: {point.config.method} r={point.config.ratio:g}"
            )

        points = []
        run = run_sweep(
            session,
            cfgs,
            should_cancel=ctx.cancelled,
            on_progress=progress,
            questions=questions,
            answer_tokens=answer_tokens,
        )
        for point in run:
            points.append(point)
            ctx.publish(point)
        ctx.check_cancelled()
        return points

    return job


#: The Session the needle grid prefills its probes on: the model's own, so the main view's prefill stays.
GRID_SESSION = "grid_session"


def needle_grid(specs: list[dict[str, Any]], configs: list[dict[str, Any]]) -> Job:
    """Run a needle grid (kvcore.probes.needle_grid) on a second Session sharing the loaded model, publishing each
    finished cell; the main session's prefill and compression are left as they are."""

    def job(ctx: JobContext) -> list[GridCell]:
        main = _session(ctx)
        session = ctx.state.get(GRID_SESSION)
        if session is None or session.model is not main.model:
            session = Session(main.model, main.tokenizer, main.info)
            ctx.state[GRID_SESSION] = session
        cfgs = [CompressionConfig.from_dict(c) for c in configs]
        cells = []
        for cell in run_grid(session, specs, cfgs, should_cancel=ctx.cancelled):
            cells.append(cell)
            ctx.publish(cell)
            ctx.progress(len(cells) / len(specs), f"Needle grid {len(cells)}/{len(specs)}")
        ctx.check_cancelled()
        return cells

    return job
