"""Shared pytest configuration: hypothesis profiles and capability markers.

Profiles: ``ci`` (derandomised, loaded automatically when CI is set),
``dev`` (few examples, for a fast local loop), ``thorough`` and ``mutation``
(derandomised, at most ``MUTATION_MAX_EXAMPLES`` examples even where a check
asks for more; ``scripts/mutation.py`` selects it).  Choose one with
HYPOTHESIS_PROFILE=name.  Torch randomness in checks always comes from a
seed drawn by hypothesis, never from global state.
"""

import json
import math
import os
from pathlib import Path

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
# Mutation testing (checks/MUTATION.md) runs the anchors once per mutant: a
# few derandomised examples, so a verdict is cheap and does not depend on the draw.
MUTATION_MAX_EXAMPLES = 3
settings.register_profile(
    "mutation",
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=MUTATION_MAX_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_default = "ci" if os.environ.get("CI") else "default-torch"
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", _default)
settings.load_profile(PROFILE)


def pytest_collection_modifyitems(config, items):
    if PROFILE != "mutation":
        return
    # A check's own @settings(max_examples=n) overrides the profile, so the cap
    # is applied to each hypothesis test here (hypothesis reads the settings
    # attribute when the test is called).
    for item in items:
        fn = getattr(item, "obj", None)
        inner = getattr(fn, "_hypothesis_internal_use_settings", None)
        if getattr(fn, "is_hypothesis_test", False) and inner is not None:
            fn._hypothesis_internal_use_settings = settings(
                inner, max_examples=min(inner.max_examples, MUTATION_MAX_EXAMPLES),
                derandomize=True, database=None)
    # mutmut stops a mutant at its first failing check (-x) but hands the
    # checks over in no particular order: the fastest first (by the durations
    # of its clean run) makes a killed mutant cheap.  Runs in mutmut's copy of
    # the tree, where its stats file lies.
    stats = Path("mutmut-stats.json")
    if stats.is_file():
        try:
            took = json.loads(stats.read_text())["duration_by_test"]
        except (ValueError, KeyError):
            return
        items.sort(key=lambda it: took.get(it.nodeid, math.inf))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # Ranks share the machine's cores; one intra-op thread each keeps the
    # suite fast on 2-core CI machines (and matches what rank processes use).
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
