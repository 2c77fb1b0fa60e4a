"""The tools' one command-line convention: `prog`, description, comma lists, recipes, encoders, $OUT,
the CUDA-only guard, and a cProfile table in markdown."""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def __getattr__(name: str) -> Any:
    """RECIPE_NAMES (sorted kernel.RECIPES) and ENCODERS (conformance.impls'), imported on first use:
    the launchers (fuzz, mutants, sanitize) use this module without importing torch."""
    if name == "RECIPE_NAMES":
        import kernel

        return sorted(kernel.RECIPES)
    if name == "ENCODERS":
        from conformance.impls import ENCODERS

        return ENCODERS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parser(module: str, doc: str | None, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser with prog `python -m tools.<module>` and the docstring's first paragraph."""
    description = (doc or "").strip().split("\n\n")[0].strip() or None
    return argparse.ArgumentParser(prog=f"python -m tools.{module}", description=description, **kwargs)


def comma_list(choices: Iterable[str] | None = None) -> Callable[[str], tuple[str, ...]]:
    """An argparse `type=`: "a, b,,c" -> ("a", "b", "c"), each one of `choices` when given."""
    allowed = None if choices is None else tuple(choices)

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(s for s in (part.strip() for part in text.split(",")) if s)
        unknown = [s for s in items if allowed is not None and s not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
        return items

    parse.__name__ = "comma-separated list"  # argparse names the type in its generic errors
    return parse


def out_dir(default: str | os.PathLike[str] = "reports", *, create: bool = True) -> Path:
    """$OUT when set, else `default`; created unless create=False (a dry run writes nothing)."""
    folder = Path(os.environ.get("OUT") or default)
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def cuda_missing(tool: str, why: str) -> int:
    """0 when torch sees a CUDA GPU; else print `tool: needs CUDA (why)` on one line and return 2, the
    exit status of every CUDA-only make target on a machine without one."""
    import torch

    if torch.cuda.is_available():
        return 0
    print(f"{tool}: needs CUDA ({why}); no CUDA device here", file=sys.stderr)
    return 2


def cprofile_markdown(title: str, run: Callable[[], object], top: int) -> str:
    """A markdown section: `run()` under cProfile, its `top` functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    out = io.StringIO()
    out.write(f"\n### {title}\n\n```\n")
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    out.write("```\n")
    return out.getvalue()
