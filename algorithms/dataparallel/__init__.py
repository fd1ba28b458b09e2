"""Data-parallel family: parameter servers and double quantisation (AsyLPG and baselines)."""
