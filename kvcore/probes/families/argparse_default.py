"""A command-line flag's default (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="argparse_default",
    bind='parser.add_argument("--{name}", default="{value}")\n',
    ask='\n# the same flag on the sub-command\nsub.add_argument("--{name}", default="',
    held_out=True,
    style="kebab",
    values="alnum",
)
