"""A Ruby symbol-keyed hash entry checked by an RSpec expectation (held-out family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="ruby_hash",
    bind="  :{name} => '{value}',\n",
    ask="\nexpect(opts[:{name}]).to eq('",
    held_out=True,
    style="snake",
    values="alnum",
)
