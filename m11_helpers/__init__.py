"""m11_helpers: the companion package of M11 · Training at Scale.

Lessons import what they need from the topic modules (``from m11_helpers.launch import launch``);
this file stays light so ``import m11_helpers`` is instant.
"""

__version__ = "0.1.0"


def assets_hint() -> str | None:
    """None when the offline slide assets are installed, else the command that installs them."""
    try:
        from m11_helpers.assets import assets_dir, installed
    except ImportError:
        return "slides support not installed"
    return None if installed() else f"missing: run `python -m m11_helpers.assets` (into {assets_dir()})"
