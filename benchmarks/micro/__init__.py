"""pytest-benchmark micro-benchmarks of hot kernels (quantise + pack, sparse encode,
perturbation generation, the byte meter): ``pytest benchmarks/micro --benchmark-only``."""
