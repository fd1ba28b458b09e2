"""Data-parallel family: parameter servers and double quantisation (AsyLPG and baselines)."""

from . import asylpg, dq_experiment  # noqa: F401
