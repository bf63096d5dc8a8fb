"""Needle probes: a generator of seeded prompts (depth, length, template family) and a scorer of continuations.

Qt-free and MLX-free (the training script imports it on a machine without MLX); `kvcore.probes.scoring` evaluates
probes on a Session.
"""

from kvcore.probes.base import Family, Probe, recalls
from kvcore.probes.families import FAMILIES, HELDOUT_FAMILIES, TRAIN_FAMILIES
from kvcore.probes.generator import VALUE_TOKENS, make_probe, token_encoder

__all__ = [
    "FAMILIES",
    "HELDOUT_FAMILIES",
    "TRAIN_FAMILIES",
    "VALUE_TOKENS",
    "Family",
    "Probe",
    "make_probe",
    "recalls",
    "token_encoder",
]
