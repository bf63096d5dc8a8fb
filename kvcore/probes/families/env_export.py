"""A shell export repeated (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="env_export",
    bind="export {name}={value}\n",
    ask="\n# restore the environment\nexport {name}=",
    held_out=False,
    style="upper",
    values="alnum",
)
