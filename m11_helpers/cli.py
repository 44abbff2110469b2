"""The `m11` command: one entry point, each subcommand owned by the module that does the work.

    m11 doctor                  what will run where (CPU processes or GPUs, backend), what is missing
    m11 course [NB...]          execute the course notebooks headless, print each one's time, build slides
    m11 make-exercises          regenerate exercises/ from solutions/
    m11 grade PATH...           autograde notebooks, write Markdown/JSON/JUnit reports
    m11 slides [NB...]          build offline reveal.js decks into build/slides/
    m11 nbclean [--check] ...   strip volatile outputs and metadata from notebooks
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS = {
    "doctor": ("m11_helpers.doctor", "main", "what will run where, and what is missing"),
    "course": ("m11_helpers.course", "main", "execute every course notebook headless and build the slides"),
    "make-exercises": ("m11_helpers.grading.exercises", "main", "regenerate exercises/ from solutions/"),
    "grade": ("m11_helpers.grading.grader", "main", "autograde notebooks and write score reports"),
    "slides": ("m11_helpers.slides", "main", "build offline reveal.js decks into build/slides/"),
    "nbclean": ("m11_helpers.notebooks", "main", "strip volatile outputs and metadata from notebooks"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: m11 COMMAND [ARGS...]\n\ncommands:")
        for name, (_, _, text) in COMMANDS.items():
            print(f"  {name:<16}{text}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"m11: unknown command {name!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
