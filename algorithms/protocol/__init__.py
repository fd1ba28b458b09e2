"""Protocol Models (subspace-constrained pipeline): ``protocol`` and ``protocol-central``."""
