"""`m11 script NAME`: print where a course script is installed, for `accelerate launch $(m11 script train.py)`."""

from __future__ import annotations

import argparse
import sys

from m11_helpers.resources import course_scripts, script_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="m11 script", description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", help=f"one of: {', '.join(course_scripts())} (none: list them)")
    args = ap.parse_args(argv)
    if args.name is None:
        print("\n".join(course_scripts()))
        return 0
    try:
        print(script_path(args.name))
    except (FileNotFoundError, ValueError) as e:
        print(f"m11 script: {e}", file=sys.stderr)
        return 2
    return 0
