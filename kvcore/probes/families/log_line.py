"""A key=value pair in a log message (training family)."""

from kvcore.probes.base import Family

FAMILY = Family(
    name="log_line",
    bind='logger.info("started with {name}={value}")\n',
    ask='\nlogger.info("restarted with {name}=',
    held_out=False,
    style="snake",
    values="digits",
)
