"""The decoding-timeline job (issue 40) and the plain data it hands the Timeline dock.

The job compresses the prefill (with the Compression panel's settings, or not at all), decodes under a policy
with the dense cache in lockstep (kvcore.engine.decode_metrics), and turns the run into a kvcore Timeline plus
token texts: NumPy and Python only, so nothing MLX crosses to the GUI thread. A cancel keeps what was generated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.engine.thread import Job, JobContext
from app.engine.view_model import TokenSteps
from kvcore.defaults import DEFAULT_SCHEDULE
from kvcore.engine.decode_metrics import decode_against_dense
from kvcore.engine.decoding import DecodingPolicy
from kvcore.engine.session import CompressionConfig
from kvcore.engine.timeline import Timeline, timeline

DECODE = "decode"
#: Progress is reported at most this often (a 8,192-token run would otherwise queue 8,192 signals).
PROGRESS_EVERY_S = 0.2


@dataclass(frozen=True)
class CamMerges:
    """Every value cam merged during a run, one entry a (evicted position, target) pair: the step it was evicted
    at, its layer and kv-head, and the share of the evicted value added to the target's (kvcore.engine.cam)."""

    step: np.ndarray  # int32 [M]
    layer: np.ndarray  # int32 [M]
    head: np.ndarray  # int32 [M]
    source: np.ndarray  # int32 [M] the evicted position
    target: np.ndarray  # int32 [M] the kept position its value went into
    share: np.ndarray  # float32 [M]

    def of_head(self, layer: int, head: int) -> np.ndarray:
        """Indices of the entries of one (layer, kv-head)."""
        return np.flatnonzero((self.layer == layer) & (self.head == head))


def cam_merges(compressions: list[Any]) -> CamMerges | None:
    """The merges recorded on a run's compressions (decoding.Compression.merges); None when none recorded any."""
    parts: list[tuple[int, int, int, np.ndarray, np.ndarray]] = []
    for c in compressions:
        for layer, heads in enumerate(c.merges or []):
            for h, merge in enumerate(heads or []):
                if len(merge.pairs):
                    parts.append((c.step, layer, h, merge.pairs, merge.weight))
    if not parts:
        return None
    sizes = [len(p[3]) for p in parts]
    column = lambda i: np.repeat([p[i] for p in parts], sizes).astype(np.int32)  # noqa: E731
    return CamMerges(
        step=column(0),
        layer=column(1),
        head=column(2),
        source=np.concatenate([p[3][:, 0] for p in parts]).astype(np.int32),
        target=np.concatenate([p[3][:, 1] for p in parts]).astype(np.int32),
        share=np.concatenate([p[4] for p in parts]).astype(np.float32),
    )


@dataclass(frozen=True)
class TimelineView:
    """A decoding run ready to draw. Columns are positions: the prompt's, then one per generated token (the
    last generated token is never written to the cache: its column stays empty)."""

    timeline: Timeline
    policy: dict[str, Any]  # method, budget, interval, n_sink
    prefill_config: (
        dict[str, Any] | None
    )  # the prefill compression decoding started from; None: the full cache
    token_texts: list[str]  # one per column
    n_prompt: int  # prompt tokens (columns before the generated ones)
    n_layers: int
    n_kv_heads: int
    not_compressible_labels: dict[int, str] = field(default_factory=dict)
    token_steps: TokenSteps | None = None  # per generated token, against the dense cache on the same history
    max_cache_tokens: int = 0
    bytes_summary: dict[str, int] = field(default_factory=dict)
    compression_steps: list[int] = field(default_factory=list)  # the steps a policy evicted at
    seconds: float = 0.0
    cancelled: bool = False
    merges: CamMerges | None = None  # cam: where each evicted value went; None for the other policies
    #: Generated past the model's trained context (max_position_embeddings), as the run controls allowed.
    beyond_context: bool = False

    @property
    def n_columns(self) -> int:
        return len(self.token_texts)

    @property
    def n_generated(self) -> int:
        return self.n_columns - self.n_prompt


def policy_text(policy: dict[str, Any]) -> str:
    """'streaming_llm · budget 256 · every 16'."""
    return f"{policy['method']} · budget {policy['budget']} · every {policy['interval']}"


def decode_timeline(
    policy: dict[str, Any],
    n: int,
    prefill_config: dict[str, Any] | None,
    schedule: str = DEFAULT_SCHEDULE,
    progress_label: str = "Decoding",
    beyond_context: bool = False,
) -> Job:
    """Decode n tokens under `policy` (DecodingPolicy's fields) from the prefill compressed with `prefill_config`
    (None: the full cache under `schedule`); returns a TimelineView (cut short, `cancelled`, when the user
    cancelled). Prompt + n past the model's trained context is refused unless `beyond_context`."""

    def job(ctx: JobContext) -> TimelineView | None:
        session = ctx.state.get("session")
        if session is None or not session.prompt_ids:
            raise ValueError("nothing is prefilled: Prefill a prompt first")
        pol = DecodingPolicy(**policy)
        cfg = (
            CompressionConfig.from_dict(prefill_config)
            if prefill_config
            else CompressionConfig("full", 1.0, schedule=schedule)
        )
        ctx_len = session.info.max_context
        beyond = ctx_len is not None and len(session.prompt_ids) + n > ctx_len
        if beyond and not beyond_context:
            raise ValueError(
                f"the prompt has {len(session.prompt_ids)} tokens and {n} more would pass the model's context of "
                f"{ctx_len}: generate at most {max(ctx_len - len(session.prompt_ids), 0)} tokens, or tick "
                "'Beyond trained context' (RoPE extrapolates; the quality past it is yours to judge)"
            )
        state = session.compress(cfg)
        start, last = time.perf_counter(), [0.0]

        def progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - last[0] >= PROGRESS_EVERY_S or done == total:
                last[0] = now
                rate = done / max(now - start, 1e-9)
                ctx.progress(
                    done / total, f"{progress_label}: {done:,} of {total:,} tokens · {rate:,.0f} tok/s"
                )

        out = decode_against_dense(session, state, pol, n, should_cancel=ctx.cancelled, on_progress=progress)
        run = out.run
        start_kept = [
            None if layer in state.not_compressible else heads
            for layer, heads in enumerate(session.kept_positions(state))
        ]
        tl = timeline(run, session.n_compressible(cfg.schedule), start_kept)
        ids = [*session.prompt_ids, *run.tokens]
        n_layers, n_heads = state.kept.shape[:2]
        return TimelineView(
            timeline=tl,
            policy={
                "method": pol.method,
                "budget": pol.budget,
                "interval": pol.interval,
                "n_sink": pol.n_sink,
            },
            prefill_config=cfg.to_dict() if prefill_config else None,
            token_texts=session.token_texts(ids),
            n_prompt=len(session.prompt_ids),
            n_layers=n_layers,
            n_kv_heads=n_heads,
            not_compressible_labels=dict(state.not_compressible),
            token_steps=_token_steps(session, run.tokens, out),
            max_cache_tokens=run.max_cache_tokens,
            bytes_summary=run.bytes_summary(),
            compression_steps=[c.step for c in run.compressions],
            seconds=time.perf_counter() - start,
            cancelled=out.cancelled,
            merges=cam_merges(run.compressions),
            beyond_context=ctx_len is not None and len(ids) > ctx_len,
        )

    return job


def _token_steps(session: Any, tokens: list[int], out: Any) -> TokenSteps:
    """The strip's data; the rows taken from the dense prefill ("paper") get no top-k lists."""
    s, first = out.steps, out.first_compared

    def texts(ids: np.ndarray) -> list[list[str]]:
        flat = session.token_texts(ids.ravel().tolist())
        k = ids.shape[1]
        rows = [flat[i * k : (i + 1) * k] for i in range(ids.shape[0])]
        return [[] if i < first else r for i, r in enumerate(rows)]

    return TokenSteps(
        tokens=session.token_texts(tokens),
        kl=np.asarray(s.kl, dtype=np.float64),
        agreement=np.asarray(s.agreement, dtype=bool),
        dense_top_ids=np.asarray(s.dense_top_ids),
        dense_top_probs=np.asarray(s.dense_top_probs, dtype=np.float64),
        dense_top_texts=texts(np.asarray(s.dense_top_ids)),
        compressed_top_ids=np.asarray(s.compressed_top_ids),
        compressed_top_probs=np.asarray(s.compressed_top_probs, dtype=np.float64),
        compressed_top_texts=texts(np.asarray(s.compressed_top_ids)),
        first_divergence=out.first_divergence,
        first_compared=first,
    )
