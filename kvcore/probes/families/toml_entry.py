"""An entry of an embedded toml table (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="toml_entry",
    bind='PYPROJECT = """\n[tool.service]\n{name} = {value}\n"""\n',
    ask='\ndata = tomllib.loads(PYPROJECT)\nassert data["tool"]["service"]["{name}"] ==',
    held_out=True,
    style="snake",
    values="digits",
)
