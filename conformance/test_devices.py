"""Devices: a call writes on its tensors' own GPU, whichever GPU is current.

Triton (and a raw CUDA launch) runs on the *current* device unless the wrapper switches to the
tensors' device, so a kernel called with every tensor on cuda:1 while cuda:0 is current reads and
writes addresses of the wrong GPU. Servers with several GPUs per process do exactly that.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import check_case

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA devices to put the tensors on one and make the other "
                                        f"current; this machine has {GPUS}"),
]


@given(data=st.data())
def test_tensors_on_a_device_that_is_not_current(data, impl):
    tensors_on = data.draw(st.integers(0, GPUS - 1), label="tensors_on")
    current = data.draw(st.integers(0, GPUS - 1).filter(lambda d: d != tensors_on), label="current_device")
    case = data.draw(impl.cases(size="large"), label="case")
    with torch.cuda.device(current):
        check_case(case, impl, torch.device("cuda", tensors_on))
