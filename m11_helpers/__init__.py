"""m11_helpers: the companion package of M11 · Training at Scale.

Lessons import what they need from the topic modules (``from m11_helpers.launch import launch``);
this file stays light so ``import m11_helpers`` is instant.
"""

__version__ = "0.1.0"
