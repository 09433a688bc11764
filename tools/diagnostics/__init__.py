"""Diagnostics: where time goes. Estimates for tuning, not speed claims (those come from ``tools.bench``).

- ``step_profile``: host time per decode step, split by phase.
"""
