"""Training throughput of the demo model's shapes on a CUDA GPU, variants side by side in one process.

A device call is capped at ten minutes, so the tokens a single-call run can see decide the demo model
(TRAINING.md). This times the real training step of `train_demo_model.py` (forward, loss, backward, clip,
fused AdamW) on random token windows, so the model's step is measured without the data pipeline; compare
with a real run's tok/s to see what the pipeline costs. Rounds are interleaved (the machine is noisy).

    python scripts/train_throughput.py --shapes small wide --rounds 3 --steps 40
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_demo_model import MODEL_SHAPES, build_model, make_step_loss  # noqa: E402

VOCAB = 8192


def _compile(module):
    import torch

    return torch.compile(module)


VARIANTS = {
    # The step before the loss was compiled with the model: compiled forward, eager float cast + loss.
    "compile_forward": lambda model, bsz: (make_step_loss(_compile(model), VOCAB, compiled=False), bsz),
    "compile_loss": lambda model, bsz: (make_step_loss(model, VOCAB, compiled=True), bsz),
    "compile_loss_b64": lambda model, bsz: (make_step_loss(model, VOCAB, compiled=True), 2 * bsz),
}


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", choices=sorted(MODEL_SHAPES), default=["small", "wide"])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=8, help="steps before timing (compiles)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda")
    runs = {}
    for shape in args.shapes:
        for name in args.variants:
            torch.manual_seed(0)
            model = build_model(shape, VOCAB, 0, device)
            step_loss, bsz = VARIANTS[name](model, args.batch_size)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=True)
            window = torch.randint(0, VOCAB, (bsz, args.seq_len + 1), device=device)

            def step(step_loss=step_loss, opt=opt, model=model, window=window):
                loss = step_loss(window)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()

            t = time.time()
            for _ in range(args.warmup):
                step()
            torch.cuda.synchronize()
            print(f"{shape:5s} {name:16s} warm-up (compile) {time.time() - t:6.1f} s", flush=True)
            runs[shape, name] = (step, bsz * args.seq_len, [])
    for r in range(args.rounds):
        for (shape, name), (step, tokens, rates) in runs.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            rates.append(args.steps * tokens / (time.perf_counter() - t))
            print(f"round {r} {shape:5s} {name:16s} {rates[-1]:12,.0f} tok/s", flush=True)
    print("shape,variant,tokens_per_step,median_tok_per_s,ratio_to_compile_forward")
    for (shape, name), (_, tokens, rates) in runs.items():
        base = statistics.median(runs.get((shape, "compile_forward"), (None, None, rates))[2])
        rate = statistics.median(rates)
        print(f"{shape},{name},{tokens},{rate:.0f},{rate / base:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
