"""A Rust string binding checked by `assert_eq!` (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="rust_assert",
    bind='let {name}: &str = "{value}";\n',
    ask='\nassert_eq!({name}, "',
    held_out=True,
    style="snake",
    values="alnum",
)
