"""A key of an embedded yaml document (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="yaml_key",
    bind='CONFIG_YAML = """\n{name}: {value}\n"""\n',
    ask="\nloaded = yaml.safe_load(CONFIG_YAML)\n# {name}:",
    held_out=True,
    style="snake",
    values="alnum",
)
