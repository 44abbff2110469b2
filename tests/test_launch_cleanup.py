"""Nothing outlives its caller: `launch_script` and `m11 course` under every way the caller can end
(SIGKILL, SIGTERM, SIGINT during a hang, a JupyterLab restart): no rank, agent or helper survives it.

Each test starts real callers (separate Python processes) whose run writes a file per step, ends
them the way a learner or JupyterLab would, then checks with psutil that no process carrying the
run's marker (in its environment: re-parented processes keep it) is left, that the rendezvous
port is closed, and that nothing writes into the run's folder any more. The callers of one test
run side by side, so the test pays for process start-up (torch in each agent) once per test, not
once per signal.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from m11_helpers.tools.kernels import TetheredKernelManager

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux")]

MARK = "M11_TEST_RUN"
STEP_S = 0.05  # the hanging script writes a file every STEP_S seconds
STEADY_FILES = 5  # files per rank before we call a run steady and end its caller
DEADLINE_S = 180  # start-up of several agents on 2 loaded cores: generous, only a hang reaches it
QUIET_S = 1.0  # after the tree is gone, the run's folder must not change for this long (20 steps)
GRACE_S = 0.5  # between the SIGTERM and the SIGKILL of a "restart" (JupyterLab: up to 5 s)

HANG = """
import os, sys, time
from pathlib import Path
out, rank = Path(sys.argv[1]), os.environ["RANK"]
for step in range(10**6):  # a training loop that checkpoints every step, forever
    (out / f"rank{rank}-{step:06d}").write_text("")
    time.sleep(float(os.environ.get("STEP_S", "0.05")))
"""

CALLER = """
import faulthandler, signal, sys
from m11_helpers.launch import launch_script
# where it is stuck, should it not end when told to (the test sends SIGUSR1, then reads the file)
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[2] + ".stack", "w"), all_threads=True)
# Ctrl-C as a terminal's foreground process gets it: a suite started in the background by a script
# (`make test &`) hands its children SIGINT ignored, and this caller would then never see the SIGINT sent it
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # likewise `nohup make test` hands SIGHUP ignored: a closed terminal ends it
if sys.argv[4] == "restart":  # a kernel busy in C code: a SIGTERM does not end it, the SIGKILL after it does
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
launch_script(sys.argv[1], sys.argv[2], num_processes=2, num_machines=int(sys.argv[3]), device="cpu",
              timeout=600, echo=False)
"""


@dataclass
class Run:
    """One caller, its marker, the folder its ranks write to, and how it is to end."""

    name: str
    ranks: int
    folder: Path
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    proc: subprocess.Popen | None = None
    port: int | None = None
    temporary: list[str] = field(default_factory=list)  # folders the run made; gone once it is stopped

    def env(self) -> dict[str, str]:
        return {**os.environ, MARK: self.marker, "STEP_S": str(STEP_S)}


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == marker:
                found.append(p)
        except psutil.Error:
            pass
    return found


def _steps(folder: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in folder.iterdir():
        rank = f.name.split("-")[0]
        counts[rank] = counts.get(rank, 0) + 1
    return counts


def _wait_steady(runs: list[Run]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    for run in runs:
        while not (len(c := _steps(run.folder)) == run.ranks and min(c.values()) >= STEADY_FILES):
            assert run.proc is None or run.proc.poll() is None, f"{run.name}: the caller ended early"
            assert time.monotonic() < deadline, f"{run.name}: no steady state within {DEADLINE_S} s: {c}"
            time.sleep(0.05)


def _rendezvous_port(run: Run) -> int:
    """The port the agents meet on (torchrun's TCP store), from a rank's environment.

    Also notes the run's temporary folders: launch_script's results folder, a tethered kernel's own.
    """
    port = None
    for p in _marked(run.marker):
        env, cmd = p.environ(), p.cmdline()
        if env.get("MASTER_PORT") and "RANK" in env:
            port = int(env["MASTER_PORT"])
            run.temporary.append(env["M11_RESULTS_DIR"])
        if "ipykernel_launcher" in cmd and "m11-kernel-" in cmd[-1]:
            run.temporary.append(os.path.dirname(cmd[-1]))
    assert port is not None, f"{run.name}: no rank with MASTER_PORT among {_marked(run.marker)}"
    return port


def _listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections(kind="tcp"))


def _check_nothing_left(runs: list[Run], exclude: set[int] = frozenset()) -> None:
    """Every run: no marked process left (within DEADLINE_S), port closed, folder quiet."""
    start = time.monotonic()
    for run in runs:
        while left := [p for p in _marked(run.marker) if p.pid not in exclude]:
            assert time.monotonic() - start < DEADLINE_S, f"{run.name}: left behind: {left}"
            time.sleep(0.01)
        assert run.port is None or not _listening(run.port), f"{run.name}: port {run.port} still open"
        assert not [d for d in run.temporary if os.path.exists(d)], f"{run.name}: temporary folders left"
    before = {run.name: sorted(os.listdir(run.folder)) for run in runs}
    time.sleep(QUIET_S)
    for run in runs:
        assert sorted(os.listdir(run.folder)) == before[run.name], f"{run.name}: written after its caller's end"


def _start_callers(tmp_path: Path, endings: list[str], machines: int) -> list[Run]:
    hang, caller = tmp_path / "hang.py", tmp_path / "caller.py"
    hang.write_text(HANG)
    caller.write_text(CALLER)
    runs = []
    for name in endings:
        run = Run(name, 2 * machines, tmp_path / name)
        run.folder.mkdir()
        run.proc = subprocess.Popen([sys.executable, str(caller), str(hang), str(run.folder), str(machines), name],
                                    env=run.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        runs.append(run)
    return runs


def _wait_or_explain(run: Run) -> int:
    """The caller's exit code; if it outlives DEADLINE_S, fail with its threads' stacks and its stderr."""
    try:
        return run.proc.wait(DEADLINE_S)
    except subprocess.TimeoutExpired:
        run.proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        stack = Path(f"{run.folder}.stack")
        tree = [(p.pid, p.name(), p.status()) for p in _marked(run.marker)]
        run.proc.kill()
        _, err = run.proc.communicate()
        raise AssertionError(f"{run.name}: the caller still ran {DEADLINE_S} s after its signal; its processes "
                             f"{tree}\nits threads:\n{stack.read_text() if stack.exists() else '?'}\n"
                             f"its stderr:\n{err[-3000:]}") from None


@pytest.mark.parametrize("machines", [1, 2], ids=["one node", "two nodes"])
def test_nothing_outlives_a_launch_script_caller_however_it_ends(tmp_path, machines):
    endings = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT,
               "SIGHUP": signal.SIGHUP,  # the terminal the caller ran in was closed
               "restart": signal.SIGKILL}  # JupyterLab's escalation: SIGTERM, a grace period, SIGKILL
    if machines > 1:
        del endings["SIGHUP"]  # the caller dies of it exactly as of SIGTERM (a default action): once is enough
    runs = _start_callers(tmp_path, list(endings), machines)
    try:
        _wait_steady(runs)
        for run in runs:
            # caller, then per node: supervisor, agent, 2 ranks
            assert len(_marked(run.marker)) >= 1 + 4 * machines, _marked(run.marker)
            run.port = _rendezvous_port(run)
            assert _listening(run.port)
            if run.name == "restart":
                run.proc.send_signal(signal.SIGTERM)
                time.sleep(GRACE_S)
                assert run.proc.poll() is None  # it outlived the SIGTERM, as a busy kernel can
            run.proc.send_signal(endings[run.name])
        for run in runs:
            code = _wait_or_explain(run)
            if run.name == "SIGINT":  # alive to handle it: launch_script stops the tree, then re-raises
                assert "KeyboardInterrupt" in run.proc.stderr.read()
            else:  # the caller just died: no Python cleanup ran in it
                assert code == -endings[run.name]
        _check_nothing_left(runs)
    finally:
        for run in runs:
            for p in _marked(run.marker):
                p.kill()


def test_a_jupyterlab_restart_of_a_busy_kernel_stops_its_runs(tmp_path):
    """A kernel busy in a cell that runs a job, restarted as JupyterLab does it.

    JupyterLab's restart asks the kernel to shut down, then SIGTERMs and finally SIGKILLs it. A busy
    ipykernel 7 exits on the request itself (measured: ~1 s, exit code 0, the cell still running);
    the escalation to SIGTERM and SIGKILL, and two nodes, are the "restart" ending of the test above.
    """
    from jupyter_client import KernelManager  # JupyterLab's own kernel manager: not ours, no tether

    (tmp_path / "hang.py").write_text(HANG)
    run = Run("kernel restart", 2, tmp_path / "run")
    run.folder.mkdir()
    km = KernelManager(kernel_name="python3")
    km.shutdown_wait_time = 2.0  # JupyterLab waits 5 s: shutdown request, SIGTERM half-way, then SIGKILL
    km.start_kernel(env=run.env(), cwd=str(tmp_path), stderr=subprocess.DEVNULL)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        # a cell that hangs, as a stuck training cell does
        kc.execute(textwrap.dedent(f"""
            from m11_helpers.launch import launch_script
            launch_script({str(tmp_path / "hang.py")!r}, {str(run.folder)!r}, device="cpu")
        """))
        _wait_steady([run])
        run.port = _rendezvous_port(run)
        assert _listening(run.port)
        km.restart_kernel(now=False)  # the restart button: the busy kernel is asked, then made, to end
        new_kernel = {km.provisioner.pid} if km.provisioner else set()
        _check_nothing_left([run], exclude=new_kernel)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        for p in _marked(run.marker):
            p.kill()


NOTEBOOK_CELL = """
import threading, time
from pathlib import Path
from m11_helpers.launch import launch, launch_script

def forked():  # ranks forked from the kernel (and their store process), writing a file per step too
    import torch.distributed as dist
    for step in range(10**6):
        (Path({folder!r}) / f"fork{{dist.get_rank()}}-{{step:06d}}").write_text("")
        time.sleep({step_s})

threading.Thread(target=launch, args=(forked,), daemon=True,
                 kwargs=dict(num_processes=2, timeout=600, show_output=False)).start()
"""
SCRIPT_LINE = """launch_script({hang!r}, {folder!r}, num_processes=2, device="cpu", echo=False, timeout=600)\n"""
HANG_LINE = "time.sleep(600)\n"


def _course_run(tmp_path: Path, name: str, script: bool = True) -> Run:
    """`m11 course` executing a notebook that forks ranks (launch) and runs a script (launch_script)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    run = Run(name, 4 if script else 2, tmp_path / name)  # 2 ranks of launch_script, 2 of launch
    run.folder.mkdir()
    cell = NOTEBOOK_CELL + (SCRIPT_LINE if script else HANG_LINE)
    nb = new_notebook(cells=[new_code_cell(cell.format(hang=str(tmp_path / "hang.py"), folder=str(run.folder),
                                                       step_s=STEP_S))])
    nbformat.write(nb, tmp_path / f"{name}.ipynb")
    run.proc = subprocess.Popen([sys.executable, "-m", "m11_helpers.tools.cli", "course", f"{name}.ipynb",
                                 "--no-slides"], cwd=tmp_path, env=run.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    return run


def _fake_repository(tmp_path: Path) -> None:
    """`m11 course` works in the course repository: a pyproject.toml of the project is enough."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "m11-helpers"\n')
    (tmp_path / "hang.py").write_text(HANG)


def test_m11_course_killed_at_any_moment_leaves_no_kernel_rank_or_helper(tmp_path):
    _fake_repository(tmp_path)
    rng = random.Random(25)
    steady = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
    # SIGINT and SIGTERM go through the same handler: the SIGINT run forks ranks only (saves an agent)
    runs = [_course_run(tmp_path, name, script=name != "SIGINT") for name in steady]
    # and one at a random moment of start-up (the kernel starting, torch importing, ranks forking...)
    moments = [("random", rng.choice(list(steady.values())), rng.uniform(0.5, 4.0))]
    early = [_course_run(tmp_path, name) for name, _, _ in moments]
    try:
        start = time.monotonic()
        for run, (_, sig, at) in sorted(zip(early, moments), key=lambda x: x[1][2]):
            time.sleep(max(0.0, start + at - time.monotonic()))
            run.proc.send_signal(sig)
        _wait_steady(runs)
        for run in runs:
            # m11 course, kernel supervisor, kernel, launch(): store + 2 ranks, launch_script: supervisor, agent, 2 ranks
            assert len(_marked(run.marker)) >= (9 if run.ranks == 4 else 6), _marked(run.marker)
            if run.ranks == 4:
                run.port = _rendezvous_port(run)
                assert _listening(run.port)
            run.proc.send_signal(steady[run.name])
        for run in runs + early:
            run.proc.wait(DEADLINE_S)
        # its own lines only: no kernel's warning, no traceback
        assert [run.proc.stdout.read() for run in runs] == [
            "", "", "  interrupted: every kernel and process it started was stopped\n"]
        assert [run.proc.returncode for run in runs] == [-signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGINT]
        _check_nothing_left(runs + early)
    finally:
        for run in runs + early:
            for p in _marked(run.marker):
                p.kill()


def test_m11_course_prints_its_own_lines_only(tmp_path):
    """No kernel warning ("running over TCP without encryption") or any other line of someone else's."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    km = TetheredKernelManager(kernel_name="python3")  # what `m11 course` starts its kernels with
    cmd = km.format_kernel_cmd()
    assert km.transport == "ipc" and cmd[:2] == [sys.executable, "-c"] and "ipykernel_launcher" in cmd
    shutil.rmtree(Path(km.connection_file).parent)

    _fake_repository(tmp_path)
    nbformat.write(new_notebook(cells=[new_code_cell("print(1 + 1)")]), tmp_path / "a.ipynb")
    out = subprocess.run([sys.executable, "-m", "m11_helpers.tools.cli", "course", "a.ipynb", "--no-slides"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["ok", "a.ipynb"], ["total", lines[1].split()[1]]]


# A caller whose launch() children ask to die with it only after it was SIGKILLed (the race between
# fork and PR_SET_PDEATHSIG, widened to seconds): each child prints its pid, then waits.
LATE = """
import os, sys, time
import m11_helpers.launch.fork as fork
real = fork.die_with_parent

def late(*args, **kwargs):
    print(os.getpid(), flush=True)
    time.sleep(2)  # the caller dies meanwhile
    real(*args, **kwargs)

fork.die_with_parent = late
fork.launch(int, num_processes=2, timeout=600)
"""


def test_launch_children_whose_caller_died_before_they_set_the_death_signal_exit():
    caller = subprocess.Popen([sys.executable, "-c", LATE], stdout=subprocess.PIPE, text=True)
    children = [int(caller.stdout.readline()) for _ in range(3)]  # the store and two ranks
    caller.kill()
    caller.wait()

    def alive() -> list[int]:
        return [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]

    deadline = time.monotonic() + 30
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive()
    for pid in left:  # leave nothing even when the test fails
        psutil.Process(pid).kill()
    assert not left, f"left running after their caller died: {left} (the store loops forever)"
