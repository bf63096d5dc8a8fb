"""Write the generated sample prompts (needle in code, dict lookup, plain code) into resources/prompts.

They come from `kvcore.probes` on held-out filler so they can be rebuilt exactly; the seeds were chosen, with
the retrained demo model, so the methods' ordering is visible at 25 % retention (README, notes.json).
Run: `.venv/bin/python scripts/make_sample_prompts.py [--check]` (--check: fail if a file would change).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tokenizers import Tokenizer  # noqa: E402

from kvcore.probes import make_probe  # noqa: E402
from kvcore.probes.filler import filler_lines, line_token_counts, take_lines  # noqa: E402
from kvcore.probes.names import make_name, make_value  # noqa: E402
from kvcore.resources import demo_model_dir, prompts_dir  # noqa: E402

NEEDLE = dict(family="setattr_call", seed=4, depth=0.35, n_tokens=900)
TABLE_SEED = 11
PLAIN_SEED = 3


def needle_in_code(tok) -> str:
    return make_probe(tok, **NEEDLE).prompt


def dict_lookup(tok) -> str:
    """A 24-key dict early in ~1,000 tokens of code; the last line looks one key up."""
    rng = random.Random(TABLE_SEED)
    lines = filler_lines()
    counts = line_token_counts(lines, lambda t: tok.encode(t).ids)
    keys = list(dict.fromkeys(make_name(rng, "snake") for _ in range(24)))
    values = [make_value(rng, "alnum") for _ in keys]
    table = (
        "ROUTES = {\n" + "".join(f'    "{k}": "{v}",\n' for k, v in zip(keys, values, strict=True)) + "}\n\n"
    )
    before = "".join(take_lines(lines, counts, rng, 150))
    after = "".join(take_lines(lines, counts, rng, 650))
    return before + "\n" + table + after + f'\nassert ROUTES["{keys[rng.randrange(len(keys))]}"] == "'


def plain_code(tok) -> str:
    rng = random.Random(PLAIN_SEED)
    lines = filler_lines()
    counts = line_token_counts(lines, lambda t: tok.encode(t).ids)
    return "".join(take_lines(lines, counts, rng, 800))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    tok = Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))
    changed = []
    for name, make in (
        ("needle_in_code", needle_in_code),
        ("dict_lookup", dict_lookup),
        ("plain_code", plain_code),
    ):
        path = prompts_dir() / f"{name}.txt"
        text = make(tok)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            changed.append(path.name)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    print(("would change: " if args.check else "written: ") + (", ".join(changed) or "nothing"))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
