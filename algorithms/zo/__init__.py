"""Zeroth-order family: seeded perturbations, MeZO, SparQ, ZO2 / DistZO2."""
