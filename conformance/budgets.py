"""Example budgets for properties that re-draw a space another property already covers.

On CUDA nearly every drawn layout compiles its own kernel variant (about 0.3 s each on the H200:
docs/results/h200-2026-12-04-c.md), so such a property runs a share of the loaded profile's examples.
"""

from __future__ import annotations

from hypothesis import settings


def share(divisor: int, floor: int = 25) -> settings:
    """Settings with 1/divisor of the loaded profile's max_examples: at least `floor`, at most the profile's.
    (gpu: 100 -> 33 for divisor 3; ci: 25 stays 25; thorough: 3000 -> 1000.)"""
    profile = settings().max_examples
    return settings(max_examples=min(profile, max(floor, profile // divisor)))
