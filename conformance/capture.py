"""One way to capture a CUDA graph: `torch.cuda.graph` with Python's garbage collector paused.

Since PyTorch 2.9, `torch.cuda.graph` no longer collects garbage before a capture (pytorch#158193). A
collection that runs during the capture can then destroy a graph an earlier example left in a reference
cycle (a failed example's traceback holds its frames), and that destruction is forbidden while a stream
captures: the capture fails with "operation failed due to a previous error during capture", or warns
"operation not permitted when stream is capturing" (pytorch#161037). Those failures are the suite's, not
the implementation's, and they come and go with the collector's timing, so a capture pauses it, as vLLM's
and TransformerEngine's captures do.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic garbage collection inside; the collector's earlier state (on or off) after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def graph_capture(graph: Any, **options: Any) -> Iterator[None]:
    """`torch.cuda.graph(graph, **options)` with the collector paused for the whole capture."""
    import torch

    with gc_paused(), torch.cuda.graph(graph, **options):
        yield
