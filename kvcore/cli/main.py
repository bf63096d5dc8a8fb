"""Headless subcommands on the same engine as the app (no Qt imported).

  kvlens compress -p "TEXT" --method snapkv --ratio 0.25 --bits 4 [--csv S] [--positions P] [--json]
                  [--decode-method streaming_llm --decode-budget 256 --decode-interval 16]  (evict while generating)
                  [--decode-method snapkv --decode-ratio 0.25 --tokens 1024 --timeline t.csv]
  kvlens sweep --prompt-file F --methods snapkv,h2o --ratios 0.1,0.25,0.5 --bits 4,8,16 --csv out.csv
               [--plot frontier.png --metric kl_mean]     (ratios may also be a range: 0.1:0.5:0.1)
  kvlens probe --methods snapkv,streaming_llm --ratios 0.25,0.5 --depths 0.1,0.5,0.9 --lengths 800,1600 --csv p.csv

The prompt comes from exactly one of `--prompt/-p TEXT`, `--prompt -` (standard input) or `--prompt-file F`;
`--max-tokens` is an alias of `--tokens` (mlx-lm's spellings). The prompt goes through the tokenizer's chat
template when it has one (`--no-chat-template` for the raw text; `--system-prompt` adds a system message).

Bad input exits with status 2 and one line naming the problem; no partial output file is ever written.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import json
import math
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from kvcore.cli import calibrate as calibrate_cli
from kvcore.cli import probe as probe_cli
from kvcore.cli import ruler as ruler_cli
from kvcore.cli.progress import draw_progress, end_progress
from kvcore.defaults import (
    ALLOWED_BITS,
    DEFAULT_CONTINUATION_TOKENS,
    DEFAULT_DECODE_INTERVAL,
    DEFAULT_EDGE_BITS,
    DEFAULT_EDGE_LAYERS,
    DEFAULT_FP_RECENT,
    DEFAULT_GROUP_SIZE,
    DEFAULT_KERNEL,
    DEFAULT_LAYER_BITS,
    DEFAULT_METHOD,
    DEFAULT_N_SINK,
    DEFAULT_QUANT,
    DEFAULT_RATIO,
    DEFAULT_SCHEDULE,
    DEFAULT_SWEEP_BITS,
    DEFAULT_SWEEP_METHODS,
    DEFAULT_SWEEP_RATIOS,
    DEFAULT_WINDOW,
    SCHEDULE_HELP,
    SCHEDULES,
    UNQUANTIZED_BITS,
    bits_or_none,
)
from kvcore.measure.export import STATS_COLUMNS, SWEEP_COLUMNS, write_csv, write_json
from kvcore.measure.export import SUMMARY_COLUMNS as SUMMARY_COLUMNS  # noqa: F401 (re-exported: its old home)
from kvcore.measure.frontier import DEFAULT_METRIC, METRICS, PlotWriter
from kvcore.resources import demo_model_dir

_BITS_HELP = f"{', '.join(map(str, ALLOWED_BITS))} or {UNQUANTIZED_BITS} (unquantized)"


class UsageError(ValueError):
    """Bad input from the command line."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line (the README's promise), with the fix where it can."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"kvlens: error: {message} (see '{self.prog} --help')\n")

    def format_help(self) -> str:
        """List the method names under --method / --methods (imported only for --help: it loads MLX)."""
        if any(a.dest in ("method", "methods") for a in self._actions):
            from kvcore.methods import summary

            names = textwrap.fill(summary(), width=100, break_on_hyphens=False)
            self.epilog = f"methods ('kvlens methods' defines each):\n{textwrap.indent(names, '  ')}"
            self.formatter_class = argparse.RawDescriptionHelpFormatter
        return super().format_help()


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvlens", description="KV Lens headless engine.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("methods", help="list every method with its definition and parameters")
    calibrate_cli.add_parser(sub, str(demo_model_dir()))
    ruler = sub.add_parser("ruler", help="RULER-format tasks scored per method and compression ratio")
    ruler.add_argument(
        "--model", default=str(demo_model_dir()), help="model folder or HF repo id (default: demo)"
    )
    ruler_cli.add_arguments(ruler)
    for name in ("compress", "sweep", "probe"):
        s = sub.add_parser(name)
        s.add_argument(
            "--model", default=str(demo_model_dir()), help="model folder or HF repo id (default: demo)"
        )
        if name == "probe":
            _add_shared(s)
            _add_prompt_set(s, s)
            probe_cli.add_arguments(s)
            continue
        source = s.add_mutually_exclusive_group()
        source.add_argument(
            "--prompt", "-p", help="the prompt text ('\\n' and '\\t' read as in mlx-lm), or - for stdin"
        )
        source.add_argument("--prompt-file", type=Path, help="a UTF-8 file holding the prompt")
        if name == "compress":
            source.add_argument(
                "--context-file",
                dest="prompt_file",
                type=Path,
                help="with --questions: the context (a UTF-8 file)",
            )
        source.add_argument(
            "--session",
            type=Path,
            help="a .kvlens session file (File ▸ Save Session…): its prefill, no new one",
        )
        if name == "sweep":
            _add_prompt_set(s, source)
        else:
            _add_chat(s)
        _add_shared(s)
        s.add_argument(
            "--tokens",
            "--max-tokens",
            dest="tokens",
            type=int,
            help=f"tokens to generate (default {DEFAULT_CONTINUATION_TOKENS}; with --session, its saved continuation's)",
        )
        s.add_argument(
            "--beyond-context",
            action="store_true",
            help="let prompt + --tokens run past the model's trained context (max_position_embeddings), e.g. "
            "--tokens 8192 on the demo model (2,048): RoPE extrapolates, the quality past it is yours to judge; "
            "--json and the CSVs record beyond_context",
        )
        s.add_argument("--csv", type=Path, help="per-(layer, kv-head) statistics")
        if name == "compress":
            s.add_argument("--method", default=DEFAULT_METHOD)
            s.add_argument("--ratio", type=float, default=DEFAULT_RATIO)
            s.add_argument(
                "--bits", type=int, default=UNQUANTIZED_BITS, help=f"keys and values: {_BITS_HELP}"
            )
            s.add_argument(
                "--key-bits",
                type=int,
                help="the keys' width (overrides --bits for keys; 16 keeps them float)",
            )
            s.add_argument(
                "--value-bits",
                type=int,
                help="the values' width (default: the keys'), e.g. --key-bits 8 --value-bits 4; "
                "16 keeps them float (--key-bits 4 --value-bits 16, or --key-bits 16 --value-bits 4)",
            )
            s.add_argument("--positions", type=Path, help="kept positions as JSON")
            s.add_argument(
                "--questions",
                type=Path,
                help="a JSONL file of {question, answer?} lines: the prompt is the context, compressed once; each "
                "question is then appended to it and answered from the dense and the compressed cache "
                "(query-agnostic, as kvpress evaluates)",
            )
            s.add_argument(
                "--query-aware",
                action="store_true",
                help="with --questions: prefill and compress context and question together, one prefill a "
                "question (the question is then in every observation window)",
            )
            s.add_argument("--json", action="store_true", help="print the summary metrics as one JSON object")
            _add_decoding(s)
        else:
            s.add_argument("--methods", default=",".join(DEFAULT_SWEEP_METHODS))
            s.add_argument(
                "--ratios",
                default=",".join(map(str, DEFAULT_SWEEP_RATIOS)),
                help="a list (0.1,0.25) or start:stop:step",
            )
            s.add_argument(
                "--bits",
                default=",".join(map(str, DEFAULT_SWEEP_BITS)),
                help="the keys' widths (and the values' unless --value-bits), comma-separated, e.g. 4,8,16",
            )
            s.add_argument(
                "--value-bits",
                default="",
                help="the values' widths, comma-separated (default: each the keys'); e.g. --bits 8 --value-bits 4,8",
            )
            s.add_argument("--plot", type=Path, help="write the memory-quality frontier as PNG or SVG")
            _add_decode_axes(s)
            s.add_argument(
                "--metric",
                choices=[m for m in METRICS if m not in ("needle_recall", "question_accuracy")],
                default=DEFAULT_METRIC,
                help=f"the frontier plot's quality axis (default {DEFAULT_METRIC})",
            )
    return p


def _add_decoding(s: argparse.ArgumentParser) -> None:
    """--decode-method/-budget/-ratio/-interval and --timeline: evict while generating --tokens
    (kvcore.engine.decoding)."""
    s.add_argument(
        "--decode-method",
        help="a decoding-time policy that evicts while the model writes: streaming_llm (the --n-sink sinks and "
        "the most recent tokens), knorm, snapkv, tova, keydiff, adakv, adakv-snapkv, adakv-knorm, adakv-keydiff, "
        "rkv, expected_attention (re-scoring the cache from the latest tokens' queries), h2o_online (H2O's "
        "accumulated attention), cam (streaming_llm whose evicted values merge into the kept rows after them) or "
        "dms (--decode-budget is its sliding window; older keys scoring −‖k‖ below --decode-threshold are evicted)",
    )
    size = s.add_mutually_exclusive_group()
    size.add_argument("--decode-budget", type=int, help="with --decode-method: rows kept per kv-head")
    size.add_argument(
        "--decode-ratio",
        type=float,
        help="with --decode-method: the share of the positions seen so far kept, in (0, 1) "
        "(kvpress's CompressionRatioDecodingPress with target_compression_ratio 1 - R)",
    )
    s.add_argument(
        "--decode-interval",
        type=int,
        default=DEFAULT_DECODE_INTERVAL,
        help=f"with --decode-method: generated tokens between evictions (default {DEFAULT_DECODE_INTERVAL})",
    )
    s.add_argument("--decode-threshold", type=float, help="with --decode-method dms: the score threshold")
    s.add_argument(
        "--timeline",
        type=Path,
        help="with --decode-method: write the cache timeline as CSV (step, layer, kv_head, position, kept: every "
        "position each head held at each eviction)",
    )


def _add_decode_axes(s: argparse.ArgumentParser) -> None:
    """sweep: decoding policies as axes (every prefill configuration × every decoding method × budget)."""
    s.add_argument(
        "--decode-methods",
        help="decoding policies to sweep, comma-separated (e.g. streaming_llm,snapkv,h2o_online): each prefill "
        "configuration then decodes --tokens under each, against the one dense continuation; --csv gets one row "
        "per (configuration, policy)",
    )
    s.add_argument("--decode-budgets", help="with --decode-methods: rows kept per kv-head, comma-separated")
    s.add_argument(
        "--decode-interval",
        type=int,
        default=DEFAULT_DECODE_INTERVAL,
        help=f"with --decode-methods: generated tokens between evictions (default {DEFAULT_DECODE_INTERVAL})",
    )


def _decode_axes(args: argparse.Namespace) -> list | None:
    """sweep's --decode-methods × --decode-budgets as DecodingPolicy objects, or None; refused before the model."""
    methods, budgets = getattr(args, "decode_methods", None), getattr(args, "decode_budgets", None)
    if methods is None and budgets is None:
        return None
    if methods is None or budgets is None:
        raise UsageError(
            "--decode-methods and --decode-budgets go together: give both (e.g. snapkv and 128,256)"
        )
    if getattr(args, "prompts", None) is not None or getattr(args, "plot", None) is not None:
        raise UsageError("--decode-methods sweeps one prompt to --csv: drop --prompts / --plot")
    from kvcore.engine.sweep import decode_grid

    try:
        return decode_grid(
            _split(methods, str, "decode-methods"),
            _split(budgets, int, "decode-budgets"),
            args.decode_interval,
            args.n_sink,
        )
    except ValueError as exc:
        raise UsageError(f"--decode-*: {exc}") from None


def _decoding_policy(args: argparse.Namespace) -> Any:
    """The --decode-* flags as a DecodingPolicy, or None; refused before the model loads."""
    method = getattr(args, "decode_method", None)
    budget = getattr(args, "decode_budget", None)
    ratio = getattr(args, "decode_ratio", None)
    timeline = getattr(args, "timeline", None)
    if method is None:
        for flag, value in (("--decode-budget", budget), ("--decode-ratio", ratio), ("--timeline", timeline)):
            if value is not None:
                raise UsageError(f"{flag} needs --decode-method (e.g. streaming_llm, snapkv or h2o_online)")
        return None
    if budget is None and ratio is None:
        raise UsageError("--decode-method needs --decode-budget (rows kept per kv-head) or --decode-ratio")
    _check_output(timeline)
    from kvcore.engine.decoding import DecodingPolicy

    try:
        return DecodingPolicy(
            method, budget, args.decode_interval, args.n_sink, ratio, threshold=args.decode_threshold
        )
    except ValueError as exc:
        raise UsageError(f"--decode-*: {exc}") from None


def _add_chat(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wrap the prompt in the tokenizer's chat template as a user message, as mlx_lm.generate does "
        "(default: on when the tokenizer has one)",
    )
    s.add_argument("--system-prompt", help="a system message before the prompt (needs a chat template)")


def _add_prompt_set(s: argparse.ArgumentParser, source: Any) -> None:
    """--prompts (a folder or a .jsonl; kvcore.sets.prompt_sets), --resume, and the chat-template options."""
    source.add_argument(
        "--prompts",
        type=Path,
        help="a prompt set: a folder of .txt/.md/.py files or a .jsonl of {id, prompt, answer?} lines",
    )
    s.add_argument(
        "--resume", action="store_true", help="with --prompts: keep the rows already in --csv, run the rest"
    )
    _add_chat(s)


def _add_shared(s: argparse.ArgumentParser) -> None:
    """Compression options every subcommand takes."""
    s.add_argument(
        "--group-size",
        type=int,
        default=DEFAULT_GROUP_SIZE,
        help="affine's group (32, 64 or 128); mxfp4, nvfp4 and mxfp8 fix theirs (32, 16, 32)",
    )
    s.add_argument(
        "--quant",
        default=DEFAULT_QUANT,
        metavar="SCHEME",
        help=f"the quantization scheme that packs K and V (a module of kvcore.quant): affine, mxfp4 (--bits 4), "
        f"nvfp4 (--bits 4), mxfp8 (--bits 8), rotated (Hadamard, then any of those: packing), kivi (keys per "
        f"channel, a float residual) … (default {DEFAULT_QUANT}); a scheme's parameters after a colon or with "
        f"--param, e.g. rotated:packing=mxfp4,seed=3 or kivi:residual=64",
    )
    s.add_argument("--shared", action="store_true", help="all kv-heads of a layer keep the same positions")
    s.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    s.add_argument("--n-sink", type=int, default=DEFAULT_N_SINK)
    s.add_argument("--kernel", type=int, default=DEFAULT_KERNEL)
    s.add_argument(
        "--param",
        type=_param_pair,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a method or --quant scheme parameter by the name it declares (repeatable), e.g. --param beta=10 "
        "for pyramidkv, --param alpha=0.3 for adakv, --param residual=64 for kivi, --param packing=1 for rotated "
        "(mxfp4); each method and the scheme take the ones they declare",
    )
    s.add_argument(
        "--fp-recent",
        type=_positions_count,
        default=DEFAULT_FP_RECENT,
        metavar="R",
        help="keep the kept sinks (--n-sink) and the last R prompt positions unquantized beside the packed rest, "
        f"and generated tokens too (a KIVI-style float residual; no effect when nothing is packed; default {DEFAULT_FP_RECENT})",
    )
    s.add_argument(
        "--layer-bits",
        type=_width_list,
        default=DEFAULT_LAYER_BITS,
        metavar="B,B,…",
        help="a width per layer (one per layer, e.g. 8,4,4,4,8), replacing each layer's key and value widths "
        "(a float side stays float); layer-adaptive, for any --quant",
    )
    s.add_argument(
        "--edge-layers",
        type=_positions_count,
        default=DEFAULT_EDGE_LAYERS,
        metavar="K",
        help=f"pack the first and last K layers at --edge-bits (the layers nearest the embeddings and the logits; "
        f"default {DEFAULT_EDGE_LAYERS}: none)",
    )
    s.add_argument(
        "--edge-bits",
        type=int,
        default=DEFAULT_EDGE_BITS,
        metavar="B",
        help=f"the width of the --edge-layers layers, keys and values (default {DEFAULT_EDGE_BITS})",
    )
    s.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=DEFAULT_SCHEDULE,
        help="; ".join(f"{k}: {v}" for k, v in SCHEDULE_HELP.items()) + f" (default {DEFAULT_SCHEDULE})",
    )


def _param_pair(text: str) -> tuple[str, int | float]:
    """argparse type of --param: NAME=VALUE with a number; the method checks the name and the value."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE (e.g. beta=10)")
    if "," in value:  # a list parameter, one number per layer (per_layer_compression's layer_ratios)
        try:
            return name.strip(), tuple(float(v) for v in value.split(",") if v.strip())  # type: ignore[return-value]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a list of numbers") from None
    try:
        return name.strip(), int(value)
    except ValueError:
        pass
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None


def _method_params(args: argparse.Namespace, methods: Sequence[str]) -> None:
    """Refuse a --param that none of `methods` nor the --quant scheme declares, naming the parameters they have."""
    from kvcore.methods import get

    declared = {p.name for m in methods for p in get(m).parameters()} | set(
        _scheme_params(getattr(args, "quant", DEFAULT_QUANT))
    )
    unknown = sorted({name for name, _ in args.param} - declared)
    if unknown:
        have = ", ".join(sorted(declared)) or "none"
        raise UsageError(
            f"--param {unknown[0]}: {', '.join(methods)} has no such parameter (declared: {have})"
        )


def _stored_form(state: Any, layer: int) -> dict[str, Any]:
    """What a method that changes the stored rows did to a layer: think's key channels per kv-head, merging's
    target of each position per kv-head (−1: kept or not merged); nothing for the others."""
    from kvcore.engine.session import Session

    out: dict[str, Any] = {}
    channels = Session.kept_channels(state)[layer]
    if channels is not None:
        out["key_channels"] = channels.tolist()
    targets = Session.merge_targets(state)[layer]
    if targets is not None:
        out["merged_into"] = targets.tolist()
    return out


def _scheme_params(quant: str) -> tuple[str, ...]:
    """The parameters --param can set on the --quant scheme (all but group_size, which has its own flag)."""
    from kvcore.quant import get as get_scheme

    try:
        return tuple(p.name for p in get_scheme(quant).parameters() if p.name != "group_size")
    except ValueError:  # an unknown scheme: refused with the schemes' names where the configuration is built
        return ()


def _quant_spec(args: argparse.Namespace) -> str:
    """--quant with the --param values its scheme declares appended: "kivi" + --param residual=64 gives
    "kivi:residual=64" (a value in the spec itself is overridden)."""
    ours = [(name, value) for name, value in args.param if name in _scheme_params(args.quant)]
    if not ours:
        return args.quant
    sep = "," if ":" in args.quant else ":"
    return args.quant + sep + ",".join(f"{name}={value}" for name, value in ours)


def _width_list(text: str) -> tuple[int, ...]:
    """argparse type of --layer-bits: comma-separated whole widths (the scheme checks each against its own)."""
    try:
        return tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of widths (e.g. 8,4,4,4,8)") from None


def _positions_count(text: str) -> int:
    """argparse type of --fp-recent: a whole number >= 0 (argparse turns the error into one line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of positions (e.g. 64)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give 0 (no residual) or more positions")
    return value


def _probe(args: argparse.Namespace) -> int:
    """`kvlens probe`: every probe and configuration checked before the model loads."""
    from kvcore.probes.plan import plan_from_text
    from kvcore.probes.scoring import PROBE_COLUMNS

    if args.query_aware and args.prompts is None:
        raise UsageError(
            "--query-aware applies to a --prompts set of contexts and questions: give one, or drop it"
        )
    if args.prompts is not None:
        if args.control:
            raise UsageError(
                "--control deletes a generated probe's needle; a --prompts set has none: drop one"
            )
        return _prompt_set(args, None)
    if args.csv is not None:
        _check_output(args.csv)
    try:
        specs = plan_from_text(args.families, args.depths, args.lengths, args.seeds, args.seed, _split)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    methods = _split(args.methods, str, "methods")
    ratios = _split(args.ratios, float, "ratios")
    bits = _split(args.bits, int, "bits")
    _method_params(args, methods)
    configs = _distinct([_config(args, m, r, b) for m, r, b in itertools.product(methods, ratios, bits)])

    from kvcore.engine.session import Session

    session = Session.load(args.model)
    rows = probe_cli.score_probes(session, specs, configs, control=args.control)
    if args.csv is not None:
        write_csv(args.csv, rows, PROBE_COLUMNS)
    probe_cli.print_summary(rows)
    return 0


def _split(text: str, kind: type, name: str) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--{name} {text!r}: expected comma-separated {kind.__name__} values") from None
    if not values:
        raise UsageError(f"--{name} is empty")
    return values


def _prompt(args: argparse.Namespace) -> str:
    """The prompt from the one source given: --prompt TEXT, --prompt - (stdin) or --prompt-file."""
    if args.prompt_file is not None:
        return _read_prompt(args.prompt_file)
    if args.prompt is None:
        raise UsageError(
            "no prompt given: pass --prompt TEXT, --prompt - (read from stdin) or --prompt-file FILE"
        )
    if args.prompt == "-":
        text = _read_stdin()
        if not text.strip():
            raise UsageError(
                "--prompt -: standard input was empty; pipe a prompt in, e.g. echo hi | kvlens ..."
            )
        return text
    if not args.prompt.strip():
        raise UsageError("--prompt is empty: give the prompt text, e.g. --prompt 'def main():'")
    return args.prompt.replace("\\n", "\n").replace("\\t", "\t")  # as mlx_lm.generate reads it


def _read_stdin() -> str:
    """Standard input decoded strictly as UTF-8, read up to the prompt size cap."""
    from kvcore.sets.prompt_sets import MAX_PROMPT_BYTES

    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read(MAX_PROMPT_BYTES + 1) if stream is not None else sys.stdin.read().encode("utf-8")
    if len(data) > MAX_PROMPT_BYTES:
        raise UsageError(
            f"--prompt -: standard input holds more than the {MAX_PROMPT_BYTES:,}-byte limit (more text than a "
            "model's context holds); shorten it"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"--prompt -: standard input is not UTF-8 text (byte {exc.start}); convert it, e.g. with iconv"
        ) from None


def _read_prompt(path: Path) -> str:
    from kvcore.sets.prompt_sets import MAX_PROMPT_BYTES, read_capped

    data = read_capped(path, "prompt file", MAX_PROMPT_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"prompt file {path} is not UTF-8 text") from None
    if not text.strip():
        raise UsageError(f"prompt file {path} is empty: write a prompt into it")
    return text


def _check_output(path: Path | None) -> None:
    """Refuse an output path before any work is done: a folder, a missing parent, an unwritable folder."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder; give a file name such as {path / 'out.csv'}")
    parent = path.parent.resolve()
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {path.parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write {path}: folder {path.parent} is not writable; choose another folder")


def _sweep_configs(args: argparse.Namespace, methods: list, ratios: Sequence[float]) -> list:
    """methods × ratios × key widths × value widths (value width None: each the keys')."""
    _method_params(args, methods)
    bits = _split(args.bits, int, "bits")
    text = getattr(args, "value_bits", "")  # probe has no --value-bits
    value_bits = _split(text, int, "value-bits") if text else [None]
    grid = itertools.product(methods, ratios, bits, value_bits)
    return _distinct([_config(args, m, r, b, v) for m, r, b, v in grid])


def _distinct(configs: list) -> list:
    """Refuse a grid that lists one configuration twice (`--bits 4,4`): it would run and write it twice."""
    keys = [(c.method, c.ratio, c.widths, c.fp_recent) for c in configs]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            c = configs[i]
            raise UsageError(
                f"configuration {c.method} ratio {c.ratio:g} bits {'/'.join(map(str, c.widths))} appears twice: "
                "list each method, ratio and bits once"
            )
    return configs


def _config(
    args: argparse.Namespace, method: str, ratio: float, bits: int, value_bits: int | None = None
) -> Any:
    from kvcore.engine.session import CompressionConfig
    from kvcore.methods import get
    from kvcore.quant import available as available_schemes
    from kvcore.quant import get as get_scheme

    declared = {p.name for p in get(method).parameters()}
    if args.quant.partition(":")[0] not in available_schemes():
        raise UsageError(f"--quant {args.quant}: available are {', '.join(available_schemes())}")
    quant = _quant_spec(args)
    try:
        allowed = get_scheme(quant).allowed_bits
    except ValueError as e:
        raise UsageError(f"--quant {quant}: {e}") from None
    help_ = (
        _BITS_HELP
        if args.quant == DEFAULT_QUANT
        else f"{', '.join(map(str, allowed))} or {UNQUANTIZED_BITS} (unquantized)"
    )
    if bits != UNQUANTIZED_BITS and bits not in allowed:
        raise UsageError(f"--bits/--key-bits {bits}: allowed are {help_}")
    if value_bits is not None and value_bits != UNQUANTIZED_BITS and value_bits not in allowed:
        raise UsageError(f"--value-bits {value_bits}: allowed are {help_}")
    return CompressionConfig(
        method=method,
        ratio=ratio,
        bits=bits_or_none(bits),
        value_bits=value_bits,
        group_size=args.group_size,
        per_head=not args.shared,
        window=args.window,
        n_sink=args.n_sink,
        kernel=args.kernel,
        schedule=args.schedule,
        fp_recent=args.fp_recent,
        params={name: value for name, value in args.param if name in declared},
        quant=quant,
        layer_bits=args.layer_bits,
        edge_layers=args.edge_layers,
        edge_bits=args.edge_bits,
    )


def _configs(args: argparse.Namespace) -> list:
    """The grid of --methods × --ratios × --bits (sweep: ratios may be a range)."""
    from kvcore.engine.sweep import parse_ratios

    methods = _split(args.methods, str, "methods")
    try:
        ratios = parse_ratios(args.ratios)
    except ValueError as exc:
        raise UsageError(f"--ratios: {exc}") from None
    return _sweep_configs(args, methods, ratios)


def _prompt_set(args: argparse.Namespace, plot_writer: PlotWriter | None) -> int:
    """`--prompts`: a prompt set, on this process or across the ranks of `mlx.launch` (kvcore.cli.prompt_sets)."""
    from kvcore.cli.prompt_sets import prompt_set_command

    if getattr(args, "plot", None) is not None:
        from kvcore.sets.results_file import FRONTIER_KEYS

        _check_plot(args.plot, plot_writer)
        if args.metric not in FRONTIER_KEYS.values():
            raise UsageError(
                f"--metric {args.metric}: a prompt-set summary has no {args.metric}; choose one of "
                f"{', '.join(k for k in FRONTIER_KEYS.values() if k != 'needle_recall')}"
            )
    if args.resume and args.csv is None:
        raise UsageError("--resume needs --csv: the file whose rows are kept")
    if args.system_prompt is not None and not args.chat_template:
        raise UsageError(
            "--system-prompt needs the chat template: drop --no-chat-template or --system-prompt"
        )
    if getattr(args, "tokens", 1) < 1:
        raise UsageError(f"--tokens must be at least 1, got {args.tokens}")
    if getattr(args, "beyond_context", False):
        raise UsageError(
            "--beyond-context applies to one prompt (--prompt, --prompt-file): drop it with --prompts"
        )
    configs = _configs(args)

    def check(session: Any, rank: int) -> None:
        from kvcore.engine.sweep import check_group_size

        if rank == 0:  # rank 0 alone writes: another machine need not have the folder
            _check_output(args.csv)
        for cfg in configs:  # the model's own refusals (sinks, latent attention) before the group size
            session.check_config(cfg)
        check_group_size(configs, session.info.head_dim, session.info.value_dim)
        if args.system_prompt is not None and not session.has_chat_template:
            raise UsageError(f"--system-prompt: the tokenizer of {session.info.name} has no chat template")

    return prompt_set_command(args, configs, check, plot_writer)


def _one_prompt(args: argparse.Namespace, plot_writer: PlotWriter | None = None) -> int:
    args.tokens_given = args.tokens is not None
    if not args.tokens_given:
        args.tokens = DEFAULT_CONTINUATION_TOKENS
    if getattr(args, "prompts", None) is not None:
        return _prompt_set(args, plot_writer)
    asked = getattr(args, "questions", None) is not None
    if asked and args.session is None and args.prompt is None and args.prompt_file is None:
        raise UsageError(
            "--questions needs a context to ask about: pass --context-file FILE (or --prompt TEXT)"
        )
    if args.beyond_context:
        _check_beyond_context(args, asked)
    prompt = None if args.session is not None else _prompt(args)
    if args.system_prompt is not None and not args.chat_template:
        raise UsageError(
            "--system-prompt needs the chat template: drop --no-chat-template or --system-prompt"
        )
    for out in (args.csv, getattr(args, "positions", None)):
        _check_output(out)
    if getattr(args, "plot", None) is not None:
        _check_plot(args.plot, plot_writer)
    if args.command == "compress":
        key_bits = args.bits if args.key_bits is None else args.key_bits
        _method_params(args, [args.method])
        configs = [_config(args, args.method, args.ratio, key_bits, args.value_bits)]
    else:
        configs = _configs(args)
    if args.tokens < 1:
        raise UsageError(f"--tokens must be at least 1, got {args.tokens}")
    args.decoding_policy = _decoding_policy(args)
    args.decode_policies = _decode_axes(args)
    questions = None
    if getattr(args, "questions", None) is not None:
        from kvcore.sets.questions_file import load_questions

        questions = load_questions(args.questions)  # a bad file is refused before the model loads
    elif getattr(args, "query_aware", False):
        raise UsageError("--query-aware applies to --questions: give a question file, or drop --query-aware")

    from kvcore.engine.session import Session
    from kvcore.engine.sweep import check_group_size

    session = Session.load(_session_model(args))
    for cfg in configs:  # every refusal (attention sinks, latent attention, group size) before the prefill
        session.check_config(cfg)
    try:
        check_group_size(configs, session.info.head_dim, session.info.value_dim)
    except ValueError as exc:
        raise UsageError(f"--group-size: {exc}") from None
    if args.system_prompt is not None and not session.has_chat_template:
        raise UsageError(
            f"--system-prompt: the tokenizer of {session.info.name} has no chat template to put it in; "
            "drop --system-prompt"
        )
    if args.session is not None:
        from kvcore.engine.session_file import open_session

        open_session(args.session, session)  # no forward pass; the saved continuation is the reference
        _session_tokens(args, len(session.dense_tokens))
    elif questions and args.chat_template and session.has_chat_template:
        _prefill_chat_context(args, session, prompt)
    else:
        session.prefill(
            prompt,
            n_tokens=args.tokens,
            chat_template=args.chat_template,
            system_prompt=args.system_prompt,
            beyond_context=args.beyond_context,
            on_continuation=_continuation_progress(args.tokens, "dense continuation"),
            keep_interrupted=True,
        )
        _dense_stopped_early(args, session)
    if args.command == "compress":
        return _compress(args, session, configs[0], questions)
    return _sweep(args, session, configs, plot_writer)


def _session_tokens(args: argparse.Namespace, saved: int) -> None:
    """A session file's saved continuation is the reference every setting is measured over: its length is the
    run's --tokens, and another length asked for is refused rather than ignored."""
    if args.tokens_given and args.tokens != saved:
        raise UsageError(
            f"--tokens {args.tokens}: the session's saved continuation has {saved} tokens, and every setting is "
            f"measured over it; drop --tokens (or pass --tokens {saved}), or prefill the prompt anew with --tokens"
        )
    args.tokens = saved


def _check_beyond_context(args: argparse.Namespace, asked: bool) -> None:
    """--beyond-context opts a new prefill's dense continuation in to positions past the trained context; where
    it could change nothing it is refused (before the model loads) rather than ignored."""
    if args.session is not None:
        raise UsageError(
            "--beyond-context applies to a new prefill (--prompt, --prompt-file): a --session file keeps its "
            "saved continuation, and --json records whether it passes the trained context; drop --beyond-context"
        )
    if asked:
        raise UsageError(
            "--beyond-context does not apply to --questions: each question and its answer must fit the trained "
            "context; drop --beyond-context (shorten the context or --tokens if it does not fit)"
        )


def _prefill_chat_context(args: argparse.Namespace, session: Any, context: str) -> None:
    """Context and question as one user message (context, then question), as mlx-lm would render it: the
    template's head and the context are prefilled; each question is fed with the template's tail."""
    from kvcore.model.prompting import split_chat

    head, args.question_suffix = split_chat(session.tokenizer, context, args.system_prompt)
    session.prefill(
        session.tokenizer.encode(head, add_special_tokens=False),
        n_tokens=args.tokens,
        beyond_context=args.beyond_context,
        keep_interrupted=True,
    )
    session.chat_template_applied = True
    _dense_stopped_early(args, session)


def _dense_stopped_early(args: argparse.Namespace, session: Any) -> None:
    """Ctrl-C during the dense continuation keeps what was generated, as a decoding policy's run does: say so,
    and measure every setting (and decode, and answer) over the tokens kept."""
    kept = len(session.dense_tokens)
    args.dense_interrupted = kept < args.tokens
    if args.dense_interrupted:
        end_progress(only_if_drawn=True)
        print(
            f"kvlens: interrupted: the dense continuation stopped early, {kept} of {args.tokens} tokens kept; "
            "every setting is measured over those",
            file=sys.stderr,
        )
        args.tokens = kept


#: A dense continuation at least this long draws its progress (on a terminal): thousands of tokens take minutes.
_LONG_CONTINUATION = 256


def _continuation_progress(n: int, label: str) -> Any:
    """A progress drawer labelled `label` for a continuation of n tokens, or None (short, or not a terminal)."""
    if n < _LONG_CONTINUATION or not sys.stderr.isatty():
        return None

    def progress(done: int, total: int) -> None:
        draw_progress(done, total, label)
        if done == total:
            end_progress()

    return progress


def _check_plot(path: Path, plot_writer: PlotWriter | None) -> None:
    """--plot: a writable .png or .svg, and the Qt writer of the `kvlens` entry point to draw it."""
    _check_output(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot {path}: write a .png or .svg file")
    if plot_writer is None:
        raise UsageError("--plot draws with Qt: run it as 'kvlens sweep …' (python -m app sweep …)")


def _session_model(args: argparse.Namespace) -> str:
    """--model, or with --session and the default --model, the model the session was saved with."""
    if args.session is None or args.model != str(demo_model_dir()):
        return args.model
    from kvcore.engine.session_file import model_folder

    return model_folder(args.session)  # a local folder whose fingerprint matches: never a download


def _sweep(args: argparse.Namespace, session: Any, configs: list, plot_writer: PlotWriter | None) -> int:
    from kvcore.engine.sweep import run_sweep

    if args.decode_policies:
        return _decode_sweep(args, session, configs)
    points = list(
        run_sweep(session, configs, on_progress=lambda done, total, p: _progress(done, total, p.config))
    )
    end_progress()
    rows = [row for p in points for row in p.csv_rows()]
    columns = SWEEP_COLUMNS
    if session.beyond_context:  # --beyond-context used: every row says its continuation passed the context
        rows, columns = [{**r, "beyond_context": True} for r in rows], (*SWEEP_COLUMNS, "beyond_context")
    rows, columns = _interrupted_column(args, rows, columns)
    if args.csv is not None:
        write_csv(args.csv, rows, columns)
    if args.plot is not None and plot_writer is not None:
        plot_writer(points, args.plot, args.metric)
    written = [str(p) for p in (args.csv, args.plot) if p is not None]
    print(
        f"{len(configs)} configurations; {len(rows)} rows"
        + (f" written to {', '.join(written)}" if written else "")
    )
    return 0


def _interrupted_column(
    args: argparse.Namespace, rows: list[dict], columns: tuple[str, ...]
) -> tuple[list[dict], tuple[str, ...]]:
    """A dense continuation stopped by Ctrl-C measured every setting over fewer tokens than asked: the CSV says so
    in a `dense_interrupted` column (absent when it ran to the end, as `beyond_context`)."""
    if not getattr(args, "dense_interrupted", False):
        return rows, columns
    return [{**r, "dense_interrupted": True} for r in rows], (*columns, "dense_interrupted")


def _decode_sweep(args: argparse.Namespace, session: Any, configs: list) -> int:
    """Every configuration × decoding policy (kvcore.engine.sweep.run_decode_sweep), one CSV row each."""
    from kvcore.engine.sweep import DECODE_SWEEP_COLUMNS, run_decode_sweep

    def progress(done: int, total: int, point: Any) -> None:
        draw_progress(done, total, f"{point.config.method} {point.config.ratio:g} + {point.policy.label()}")

    points = list(run_decode_sweep(session, configs, args.decode_policies, args.tokens, on_progress=progress))
    end_progress()
    rows, columns = _interrupted_column(args, [p.row() for p in points], DECODE_SWEEP_COLUMNS)
    if args.csv is not None:
        write_csv(args.csv, rows, columns)
    for row in rows:
        print(
            f"{row['method']} {row['ratio']:g} + {row['decode_method']} {row['decode_budget']}: agreement "
            f"{row['decode_agreement']:.3f}, first divergence {row['decode_first_divergence']}, "
            f"max cache {row['max_cache_tokens']}"
        )
    print(f"{len(rows)} points" + (f" written to {args.csv}" if args.csv is not None else ""))
    return 0


def _compress(args: argparse.Namespace, session: Any, cfg: Any, questions: list | None = None) -> int:
    from kvcore.engine.questions import accuracy
    from kvcore.engine.sweep import summary_row

    state = session.compress(cfg)
    if state.budget_note:
        print(f"kvlens: note: {state.budget_note}", file=sys.stderr)
    regen = session.regenerate(
        state, on_progress=_continuation_progress(args.tokens, f"{cfg.method} {cfg.ratio:g} continuation")
    )
    summary = {
        **summary_row(regen.metrics),
        "budget_note": state.budget_note,
        "beyond_context": session.beyond_context,
        "trained_context": session.info.max_context,
        "dense_interrupted": getattr(args, "dense_interrupted", False),
    }
    if questions and args.query_aware:
        from kvcore.engine.questions import answer_query_aware

        suffix = getattr(args, "question_suffix", "")
        context = list(session.prompt_ids)
        answers = [answer_query_aware(session, context, q, cfg, args.tokens, suffix) for q in questions]
    else:
        suffix = getattr(args, "question_suffix", "")
        answers = [session.answer(state, q, args.tokens, suffix) for q in questions or ()]
    if args.decoding_policy is not None:
        summary.update(_decode_summary(session, state, args.decoding_policy, args.tokens, args.timeline))
    if answers:
        summary["accuracy_dense"] = accuracy(answers, compressed=False)
        summary["accuracy_compressed"] = accuracy(answers, compressed=True)
    if args.csv is not None:
        write_csv(args.csv, state.stats_rows, STATS_COLUMNS)
    if args.positions is not None:
        write_json(
            args.positions,
            {
                "model": session.info.path,
                "prompt_tokens": session.prompt_ids,
                "chat_template": session.chat_template_applied,
                **cfg.describe(),
                "layers": [
                    {"layer": i, "heads": heads, **_stored_form(state, i)}
                    for i, heads in enumerate(session.kept_positions(state))
                ],
            },
        )
    if args.json:
        rows = {"questions": [a.row() for a in answers]} if answers else {}
        print(json.dumps(_json_safe({**cfg.describe(), **summary, **rows}), allow_nan=False))
    else:
        _print_human(session, summary, regen.tokens)
        for a in answers:
            mark = {True: " ✓", False: " ✗", None: ""}
            print(f"Q: {a.question.text!r}")
            print(f"  dense:      {a.dense_text!r}{mark[a.dense_correct]}")
            print(f"  compressed: {a.compressed_text!r}{mark[a.compressed_correct]}")
    return 0


def _decode_summary(
    session: Any, state: Any, policy: Any, n: int, timeline: Path | None = None
) -> dict[str, Any]:
    """The continuation under a decoding policy against the dense one (computed once, at the prefill): cache size,
    bytes, agreement. Ctrl-C keeps what was generated (`decode_interrupted`); --timeline writes its CSV."""
    from kvcore.engine.decode_report import decode_summary
    from kvcore.engine.decoding import decode_with_policy
    from kvcore.engine.timeline import of_run, write_timeline_csv

    label = f"decoding {policy.label()}"
    drawn = sys.stderr.isatty()
    run = decode_with_policy(
        session, state, policy, n, on_progress=(lambda d, t: draw_progress(d, t, label)) if drawn else None
    )
    if drawn:
        end_progress()
    if run.interrupted:
        print(f"kvlens: interrupted: {len(run.tokens)} of {n} tokens kept", file=sys.stderr)
    if timeline is not None:
        write_timeline_csv(timeline, of_run(run))
    return {**decode_summary(session, run), "decode_text": session.tokenizer.decode(run.tokens)}


def _json_safe(value: Any) -> Any:
    """NaN and ±inf as null: JSON has no such numbers, and a bare NaN breaks every strict reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _progress(done: int, total: int, cfg: Any) -> None:
    key_bits, value_bits = cfg.widths
    bits = f"{key_bits}" if key_bits == value_bits else f"{key_bits}/{value_bits}"
    bits += f" fp{cfg.fp_recent}" if cfg.fp_recent else ""
    draw_progress(done, total, f"{cfg.method} r={cfg.ratio:g} bits={bits}")


def _print_human(session: Any, summary: dict, tokens: list[int]) -> None:
    dense = session.tokenizer.decode(session.dense_tokens)
    comp = session.tokenizer.decode(tokens)
    print(f"dense:      {dense!r}")
    print(f"compressed: {comp!r}")
    if "decode_text" in summary:
        print(f"decoding:   {summary['decode_text']!r}")
    for k, v in summary.items():
        if k == "decode_text":
            continue
        print(f"{k:>24}: {v:.4g}" if isinstance(v, float) else f"{k:>24}: {v}")


def _check_args(args: argparse.Namespace) -> None:
    """Before any work: text arguments are text (argv is decoded with surrogateescape, so a byte that is not
    UTF-8 arrives as a lone surrogate), and no output is an input or another output."""
    from kvcore.cli.paths import clash

    for name, value in vars(args).items():
        if isinstance(value, str | Path) and not _is_utf8(str(value)):
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag}: the argument is not UTF-8 text; pass UTF-8 (convert it, e.g. with iconv)"
            )
    message = clash(args)
    if message is not None:
        raise UsageError(message)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _os_error(exc: OSError) -> str:
    """A filesystem failure as one line: the file, the reason, and what to do."""
    what = f"{exc.filename}: {exc.strerror}" if exc.filename is not None and exc.strerror else str(exc)
    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        fix = "free space (or raise the file size limit) and run it again; the previous file is unchanged"
    elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
        fix = "the folder was removed or replaced while the command ran; recreate it and run again"
    elif exc.errno == errno.EISDIR:
        fix = "a folder is where the file goes; remove it or give another file name"
    else:
        fix = "check the folder and run it again"
    return f"{what}; {fix}"


def main(argv: list[str], plot_writer: PlotWriter | None = None) -> int:
    """Entry point for `kvlens <subcommand>`; returns the exit status. `plot_writer` draws `sweep --plot`."""
    from kvcore.model.loading import ModelLoadError
    from kvcore.sets.ranks import RankLost

    args = _parser().parse_args(argv)
    if args.command == "methods":
        from kvcore.cli.methods import method_lines

        print("\n".join(method_lines()))
        return 0
    try:
        _check_args(args)
        if args.command == "calibrate":
            return calibrate_cli.run(args)
        if args.command == "ruler":
            return ruler_cli.command(args)
        return _probe(args) if args.command == "probe" else _one_prompt(args, plot_writer)
    except (
        RankLost
    ) as exc:  # another rank died: the finished rounds are kept, as when mlx.launch stops this one
        end_progress(only_if_drawn=True)
        print(f"kvlens: error: {exc}", file=sys.stderr)
        return 1
    except (UsageError, ModelLoadError, ValueError) as exc:
        end_progress(only_if_drawn=True)
        print(f"kvlens: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder gone or replaced mid-run: the old file is intact
        end_progress(only_if_drawn=True)
        print(f"kvlens: error: {_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvlens: interrupted", file=sys.stderr)
        return 130
