"""The environment variables one graded run is steered by: the grader, its pytest plugin and the sandbox agree here.

A module of names only, importing nothing, so that what reads them (engine/runner.py, sandbox/isolate.py) never imports
the plugin, and with it pytest: the instructor workflow's collect and merge jobs install the course
without pytest or torch (tests/test_instructor_ci.py runs their commands with nothing else importable).
"""

__all__ = ["LOG_ENV", "CWD_ENV", "TIMEOUT_ENV", "MODE_ENV", "RUN_ENV"]

LOG_ENV = "M11_GRADE_LOG"  # the file (in the sandbox: an inherited descriptor) the plugin writes cell records to
CWD_ENV = "M11_GRADE_CWD"  # the submitted notebook's folder: the kernel's working directory
TIMEOUT_ENV = "M11_GRADE_CELL_TIMEOUT"  # seconds a cell may run before the plugin's watchdog steps in
MODE_ENV = "M11_GRADE_SANDBOX"  # auto | require | off (sandbox/isolate.py)
RUN_ENV = "M11_GRADE_RUN"  # every process of one run carries it (tests find survivors by it)
