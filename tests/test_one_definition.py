"""Every compression constant and default is defined once, in kvcore/defaults.py: a grep over the source.

A second copy drifts (issue 13 found allowed bits in four places and the compression defaults in five), so the
engine, CLI, controls and settings must import them. The check is syntactic (ast), so it cannot be fooled by
formatting, and it reports file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kvcore import defaults

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("kvcore", "app", "scripts", "benchmarks") for p in (ROOT / d).rglob("*.py"))
DEFAULTS_FILE = ROOT / "kvcore" / "defaults.py"
#: Parameters and fields whose default is a compression default: a literal there is a copy of defaults.py.
DEFAULTED = {"method", "ratio", "group_size", "window", "n_sink", "kernel", "last_method", "last_ratio"}
NAMES = {n for n in vars(defaults) if n.isupper()}
TUPLES = {
    tuple(defaults.ALLOWED_BITS),
    tuple(defaults.ALLOWED_GROUP_SIZES),
    (*defaults.ALLOWED_BITS, defaults.UNQUANTIZED_BITS),
}


def _copies_a_value(node: ast.AST | None) -> bool:
    """A literal that could copy a default; None ("not given: the method's own") copies none."""
    return isinstance(node, ast.Constant) and node.value is not None


def _literal_defaults(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            found += [(d.lineno, a.arg) for a, d in pairs if a.arg in DEFAULTED and _copies_a_value(d)]
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id in DEFAULTED
            and _copies_a_value(node.value)
        ):
            found.append((node.lineno, node.target.id))
    return found


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(ROOT)
    out = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        out += [
            f"{where}:{node.lineno}: {t.id} redefined" for t in targets if getattr(t, "id", None) in NAMES
        ]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            try:
                value = tuple(ast.literal_eval(node))
            except (ValueError, TypeError, SyntaxError):
                continue
            if isinstance(node, ast.Set):
                value = tuple(sorted(value))
            if all(isinstance(v, int) for v in value) and value in TUPLES:
                out.append(f"{where}:{node.lineno}: literal {value} copies kvcore.defaults")
    if where.parts[0] != "benchmarks":  # a benchmark's ratio is the point it measures, not a default
        out += [f"{where}:{line}: literal default for {name}" for line, name in _literal_defaults(tree)]
    return out


def test_the_source_defines_each_constant_once():
    offences = [o for p in SOURCES if p != DEFAULTS_FILE for o in _offences(p)]
    assert offences == []


def test_the_check_sees_a_copy(tmp_path):
    """The grep is not vacuous: each kind of copy it looks for is reported."""
    copy = tmp_path / "copy.py"
    copy.write_text(
        "ALLOWED_BITS = (2, 3, 4, 5, 6, 8)\n"
        "steps = [32, 64, 128]\n"
        "ok = {8, 6, 5, 4, 3, 2}\n"
        "def f(window: int = 64, *, ratio=0.25): ...\n"
        "class C:\n    last_method: str = 'snapkv'\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _offences(copy)
    finally:
        ROOT = saved
    assert [o.split(": ", 1)[1] for o in found] == [
        "ALLOWED_BITS redefined",
        "literal (2, 3, 4, 5, 6, 8) copies kvcore.defaults",
        "literal (32, 64, 128) copies kvcore.defaults",
        "literal (2, 3, 4, 5, 6, 8) copies kvcore.defaults",
        "literal default for window",
        "literal default for ratio",
        "literal default for last_method",
    ]


def test_the_engine_config_and_the_controls_dict_start_equal():
    from kvcore.engine.session import CompressionConfig

    engine = CompressionConfig().to_dict()
    assert engine.pop("seed") == defaults.DEFAULT_SEED
    assert engine == defaults.DEFAULT_CONFIG
