"""An upper-case int constant, printed with a comment that restates it (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="py_upper_const",
    bind="{name} = {value}\n",
    ask='\nif __name__ == "__main__":\n    print({name})  # {name} =',
    held_out=False,
    style="upper",
    values="digits",
)
