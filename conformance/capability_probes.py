"""The capability probes as pytest tests: one per probe row of conformance/diagnosis/capabilities.py.

Not collected by `make test` (the file name does not start with test_): `python -m tools.conformance`
names it, so that the probes run in the same pytest run as the property families (the same
implementation, held recipe, budget and xdist workers; a crash takes down one worker, not the run).
$KVFP8_PROBE_EXAMPLES sets the examples a row (default: 4 on the CPU, 6 on CUDA).
"""

from __future__ import annotations

import os

import pytest

from conformance.diagnosis.capabilities import PROBE_ROWS, InputClass, default_examples, probe


@pytest.mark.parametrize("row", PROBE_ROWS, ids=[r.id for r in PROBE_ROWS])
def test_capability(row: InputClass, impl, device):
    examples = int(os.environ.get("KVFP8_PROBE_EXAMPLES") or default_examples(device))
    probe(row, impl, device, examples)
