"""The `m11` command: one entry point, each subcommand owned by the module that does the work.

    m11 doctor                  what will run where (CPU processes or GPUs, backend), what is missing
    m11 course [NB...]          execute the course notebooks headless, print each one's time, build slides
    m11 make-exercises          regenerate exercises/ from solutions/
    m11 grade PATH...           autograde notebooks, write Markdown/JSON/JUnit reports
    m11 slides [NB...]          build offline reveal.js decks into build/slides/
    m11 site                    build the course website (every lesson executed, searchable) into build/site/
    m11 nbclean [--check] ...   strip volatile outputs and metadata from notebooks
    m11 new-lesson NN topic     write a lesson skeleton that passes the suite
    m11 where NN                every place of a lesson: modules, notebooks and exercise cells, wrong answers, tests
    m11 script NAME             print the path of a training script that ships with the course
    m11 gpu-check [--list]      run every GPU branch of the course on this machine, report in build/
"""

from __future__ import annotations

import importlib
import sys

from m11_helpers.tools.fast_start import skip_iri_grammar
from m11_helpers.tools.paths import NotInRepository

# subcommand -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS = {
    "doctor": ("m11_helpers.tools.doctor", "main", "what will run where, and what is missing"),
    "course": ("m11_helpers.tools.course", "main", "execute every course notebook headless and build the slides"),
    "make-exercises": ("m11_helpers.grading.authoring.exercises", "main", "regenerate exercises/ from solutions/"),
    "grade": ("m11_helpers.grading.classroom.command", "main", "autograde notebooks and write score reports"),
    "slides": ("m11_helpers.tools.slides", "main", "build offline reveal.js decks into build/slides/"),
    "site": ("m11_helpers.tools.course_site", "main", "build the course website from the executed notebooks into build/site/"),
    "nbclean": ("m11_helpers.tools.notebooks", "main", "strip volatile outputs and metadata from notebooks"),
    "new-lesson": ("m11_helpers.tools.new_lesson", "main", "write a lesson skeleton that passes the suite"),
    "where": ("m11_helpers.tools.where", "main", "every place of lesson NN: modules, notebooks, wrong answers, tests"),
    "script": ("m11_helpers.tools.scripts", "main", "print the path of a course script (for accelerate launch)"),
    "gpu-check": ("m11_helpers.tools.gpu_check", "main", "run every GPU branch of the course, write build/gpu-check.md"),
}


# the extra a command needs beyond the core (the notebooks' install): without it, `m11` says what to install
EXTRAS = {"course": "slides", "slides": "slides", "site": "site", "grade": "grade", "make-exercises": "grade", "nbclean": "dev",
          "new-lesson": "dev"}


def _usage() -> str:
    lines = ["usage: m11 [--version] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<16}{text}" for name, (_, _, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        from m11_helpers import __version__

        print(f"m11 {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"m11: unknown command {name!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    skip_iri_grammar()  # 1 s of every command's start (fast_start.py)
    try:
        return int(getattr(importlib.import_module(module), func)(rest) or 0)
    except SystemExit as e:  # argparse's usage errors exit 2; keep that code, never a traceback
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except NotInRepository as e:  # `m11 course` outside the course repository: a usage mistake
        print(f"m11 {name}: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # a command whose extra is not installed (e.g. nbconvert for slides)
        extra = EXTRAS.get(name)
        if extra is None or not e.name or e.name.split(".")[0] == "m11_helpers":
            raise
        from m11_helpers.tools.setup_cell import install_spec

        print(f"m11 {name}: needs {e.name!r}, which the course's [{extra}] extra installs: "
              f"{sys.executable} -m pip install '{install_spec(extra=extra)}'", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
