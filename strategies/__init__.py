"""Hypothesis strategies that draw Cases: one module per input dimension, composed in `cases`."""

from strategies.case import Case, Layout, Override, Scale
from strategies.cases import cases

__all__ = ["Case", "Layout", "Override", "Scale", "cases"]
