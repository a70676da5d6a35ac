"""Choosing how a launch is shown: widgets where a widget front end is connected, else text."""
from __future__ import annotations

from .textview import TextView


def make_sinks(spec, shell=None) -> list:
    return [TextView(spec)]
