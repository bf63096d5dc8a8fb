"""A shell variable compared in a test expression (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="shell_test",
    bind='{name}="{value}"  # written by the installer\n',
    ask='\nif [ "${{{name}}}" != "',
    held_out=True,
    style="upper",
    values="alnum",
)
