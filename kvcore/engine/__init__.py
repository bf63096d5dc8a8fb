"""A model session: prefill once, compress and regenerate, sweep, save and open."""
