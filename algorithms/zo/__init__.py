"""Zeroth-order family: seeded perturbations, MeZO, SparQ, ZO2 and DistZO2 (PertP, DDP, 2D)."""
