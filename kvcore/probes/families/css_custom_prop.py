"""A CSS custom property, used through `var()` and then restated in a comment (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="css_custom_prop",
    bind=":root {{ --{name}: {value}; }}\n",
    ask="\n.card {{ border-color: var(--{name}); }}\n/* --{name}:",
    held_out=True,
    style="kebab",
    values="alnum",
)
