"""Hypothesis settings for the fuzz tests: one profile for the suite, one for a long run.

    HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest tests/fuzz --hypothesis-show-statistics

``suite`` (the default) runs each property on a modest, fixed set of examples (``derandomize``:
the same cases every run, so the suite cannot turn red by chance); ``long`` runs ``LONG_FACTOR``
times as many, freshly drawn. Neither has a deadline: no property asserts a time.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "suite")
LONG_FACTOR = 25

settings.register_profile("suite", deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(PROFILE)


def examples(suite: int) -> int:
    """Examples per property: ``suite`` in the suite's profile, ``LONG_FACTOR`` times that in ``long``."""
    return suite * LONG_FACTOR if PROFILE == "long" else suite
