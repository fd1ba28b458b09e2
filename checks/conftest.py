"""Shared pytest configuration: hypothesis profiles and capability markers.

Profiles: ``ci`` (derandomised, loaded automatically when CI is set),
``dev`` (few examples, for a fast local loop) and ``thorough``.  Choose one
with HYPOTHESIS_PROFILE=name.  Torch randomness in checks always comes from a
seed drawn by hypothesis, never from global state.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("default-torch", deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=5)
settings.register_profile("thorough", deadline=None, max_examples=500)

_default = "ci" if os.environ.get("CI") else "default-torch"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _default))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # Ranks share the machine's cores; one intra-op thread each keeps the
    # suite fast on 2-core CI machines (and matches what rank processes use).
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
