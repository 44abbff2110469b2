"""The kit every lesson uses: validation, timing, process cleanup, display, packaged resources, the setup line."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from m11_helpers import REPO, __version__, procs, setup, tether
from m11_helpers import environment as environment_module
from m11_helpers.display import Table, show_table
from m11_helpers.environment import environment, gpu_names, setup_line
from m11_helpers.launch.base import gpu_count
from m11_helpers.procs import die_with_parent, kill_descendants, kill_tree, stop, subreaper
from m11_helpers.resources import course_scripts, script_path
from m11_helpers.tether import tethered_popen
from m11_helpers.timing import Timing, format_seconds, time_it
from m11_helpers.validate import fraction, non_negative_int, non_negative_real, one_of, positive_int, positive_real


@pytest.mark.parametrize("check, good, bad", [
    (positive_int, [1, 7], [0, -1, 1.0, True, "2", None]),
    (non_negative_int, [0, 3], [-1, 0.5, False]),
    (positive_real, [1e-9, 2, 3.5], [0, -1, math.nan, math.inf, True, "1"]),
    (non_negative_real, [0, 0.0, 2.5], [-1e-9, math.nan, -math.inf]),
    (fraction, [0.5, 1], [0, 1.01, math.nan]),
])
def test_validators_accept_good_values_and_name_the_parameter_for_bad_ones(check, good, bad):
    for v in good:
        assert check("x", v) == v
    for v in bad:
        with pytest.raises(ValueError, match=r"^x must be"):
            check("x", v)


def test_one_of_lists_the_allowed_values():
    assert one_of("parallel", "ddp", ("ddp", "fsdp2")) == "ddp"
    with pytest.raises(ValueError, match="parallel must be one of 'ddp', 'fsdp2', got 'zero'"):
        one_of("parallel", "zero", ("ddp", "fsdp2"))


def test_time_it_warms_up_repeats_and_reports_the_median():
    calls = []
    t = time_it(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(t.samples) == 4
    assert Timing((3.0, 1.0, 2.0)).median == 2.0 and Timing((3.0, 1.0, 2.0)).min == 1.0
    assert "median of 3" in str(Timing((3.0, 1.0, 2.0)))
    assert format_seconds(0.0123) == "12.3 ms" and format_seconds(2) == "2.00 s"
    with pytest.raises(ValueError, match="repeats"):
        time_it(lambda: None, repeats=0)


def _sleeper_tree() -> subprocess.Popen:
    # a child that starts a grandchild: both must go
    code = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_kill_tree_and_stop_leave_nothing_behind():
    for end in (lambda p: kill_tree([p.pid]), lambda p: stop(p, grace=0.5)):
        proc = _sleeper_tree()
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        end(proc)
        assert proc.poll() is not None
        assert not [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and subreapers are Linux")
def test_die_with_parent_and_subreaper_catch_orphans():
    # parent forks a child that asks to die with it, then the parent is SIGKILLed
    code = ("import os, sys, time\nfrom m11_helpers.procs import die_with_parent\n"
            "if os.fork() == 0:\n    die_with_parent()\n    print(os.getpid(), flush=True)\n    time.sleep(60)\n"
            "    os._exit(0)\ntime.sleep(60)\n")  # the child reports only once it asked to die with its parent
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != "zombie" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    # a double-forked daemon re-parents to a subreaper, where kill_descendants finds it
    with subreaper():
        subprocess.run([sys.executable, "-c", "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n"], check=True)
        orphans = psutil.Process().children()
        assert orphans, "the orphan should have re-parented to this process"
        kill_descendants()
        assert not [p for p in psutil.Process().children() if p.status() != "zombie"]
    assert callable(die_with_parent)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_die_with_parent_exits_when_the_parent_is_already_gone():
    # parent=1: "the process that forked me" is not our real parent, as after the parent died before
    # the call; no death signal would ever come, so the child must not run on.
    code = "from m11_helpers.procs import die_with_parent\ndie_with_parent(parent=1)\nprint('ran on')\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "ran on" not in out.stdout
    code = f"from m11_helpers.procs import die_with_parent\ndie_with_parent(parent={os.getpid()})\nprint('ran on')\n"
    assert "ran on" in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout


@pytest.mark.parametrize("body, code, printed", [
    ("raise ValueError('bad batch')", 1, "ValueError: bad batch"),  # the traceback, then exit 1
    ("raise SystemExit(3)", 3, ""), ("raise SystemExit('no data')", 1, "no data"), ("raise SystemExit", 0, ""),
    ("return 'ok'", None, "after main"),  # no failure: the script goes on
])
def test_exit_on_failure_leaves_at_once_with_the_failures_code(body, code, printed):
    # A thread still running (as gloo's and the async checkpointer's are) would hold a normal exit for a minute.
    script = ("import threading, time\nfrom m11_helpers.procs import exit_on_failure\n"
              "def main():\n    threading.Thread(target=time.sleep, args=(60,)).start()\n"
              f"    {body}\nexit_on_failure(main)\nprint('after main')\nimport os\nos._exit(7)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == (7 if code is None else code), out.stderr
    assert printed in out.stdout + out.stderr
    assert ("Traceback" in out.stderr) == (code == 1 and "Error" in printed)


STOPPABLE = """
import os, signal, sys, time
from m11_helpers.procs import on_stop_signals
if sys.argv[1] == "terminal":  # as a terminal's process gets it, however this suite was started
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
on_stop_signals(lambda signum, _frame: os._exit(100 + signum), (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nohup and SIGHUP as on Linux")
@pytest.mark.parametrize("started", ["terminal", "nohup"])
def test_stop_signals_stop_us_but_a_sighup_nohup_ignored_stays_ignored(started):
    # `nohup m11 grade class/ &`, then the terminal closes: grading must go on (and SIGTERM still stop it)
    argv = [sys.executable, "-c", STOPPABLE, started]
    proc = subprocess.Popen(["nohup", *argv] if started == "nohup" else argv, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGHUP)  # the first signal sent: its handler, if it has one, ends the process
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 100 + (signal.SIGTERM if started == "nohup" else signal.SIGHUP)
    finally:
        proc.kill()


def test_the_supervisor_is_its_own_module_and_procs_keeps_the_primitives():
    assert set(tether.__all__) == {"tethered", "tethered_popen", "end_descendants"}
    assert not set(tether.__all__) & set(dir(procs)), "procs re-exports nothing of tether"
    argv = tether.tethered(["true"])
    assert argv[0] == sys.executable and tether.__file__ in argv[2] and argv[-2:] == ["--", "true"]


# A program whose child escapes into a session of its own (as torchrun's ranks do), then sleeps or exits.
ESCAPER = ("import subprocess, sys, time\n"
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
           "time.sleep(float(sys.argv[1]))\nsys.exit(int(sys.argv[2]))\n")


def _tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("M11_TEST_TAG") == tag:
                found.append(p)
        except psutil.Error:
            pass
    return found


def _wait_tagged(tag: str, n: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while len(_tagged(tag)) < n:
        assert time.monotonic() < deadline, f"only {_tagged(tag)} of {n} processes started"
        time.sleep(0.02)


def _gone(tag: str, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _tagged(tag)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux")
def test_a_tethered_program_ends_with_its_status_and_leaves_nothing():
    env = {**os.environ, "M11_TEST_TAG": "exit"}
    proc = tethered_popen([sys.executable, "-c", ESCAPER, "0.5", "3"], env=env)
    assert proc.wait(60) == 3  # the program's status, through the supervisor
    assert _gone("exit"), "the escaped grandchild should be killed when the program ends"
    proc = tethered_popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert proc.wait(60) == -signal.SIGTERM  # killed by a signal: the caller sees that signal
    proc = tethered_popen([sys.executable, "-c", ESCAPER, "60", "0"], env={**env, "M11_TEST_TAG": "stop"})
    _wait_tagged("stop", 3)  # supervisor, program, grandchild
    proc.terminate()  # the supervisor asked to stop: it kills the whole tree
    assert proc.wait(60) == -signal.SIGTERM and _gone("stop")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux")
def test_a_tethered_tree_dies_with_a_sigkilled_caller():
    code = ("import sys, time\nfrom m11_helpers.tether import tethered_popen\n"
            "tethered_popen([sys.executable, '-c', sys.argv[1], '60', '0'])\ntime.sleep(60)\n")
    caller = subprocess.Popen([sys.executable, "-c", code, ESCAPER], env={**os.environ, "M11_TEST_TAG": "caller"})
    _wait_tagged("caller", 4)  # caller, supervisor, program, grandchild in its own session
    caller.kill()  # no cleanup can run in the caller
    caller.wait()
    assert _gone("caller"), f"left behind: {_tagged('caller')}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux")
def test_a_stopped_supervisor_lets_a_nested_one_clean_up(tmp_path):
    # a kernel under a supervisor runs launch_script, under its own supervisor with a results folder
    folder = tmp_path / "results"
    folder.mkdir()
    kernel = ("import sys, time\nfrom m11_helpers.tether import tethered_popen\n"
              "tethered_popen([sys.executable, '-c', sys.argv[1], '60', '0'], remove_if_abandoned=[sys.argv[2]])\n"
              "time.sleep(60)\n")
    proc = tethered_popen([sys.executable, "-c", kernel, ESCAPER, str(folder)],
                          env={**os.environ, "M11_TEST_TAG": "nested"})
    _wait_tagged("nested", 5)  # supervisor, "kernel", its supervisor, its program, the escaped grandchild
    proc.terminate()
    assert proc.wait(60) == -signal.SIGTERM
    assert _gone("nested") and not folder.exists()


def test_table_renders_as_text_and_html_from_the_same_rows():
    t = Table([{"setup": "DDP", "GB": 16.0}, {"setup": "ZeRO-3", "GB": 2.25}], floatfmt=".2f")
    assert str(t).splitlines() == ["setup      GB", "------  -----", "DDP     16.00", "ZeRO-3   2.25"]
    assert "<td style=\"text-align:right\">2.25</td>" in t._repr_html_()
    assert show_table([(1, "a")], ["n", "x"]) is None  # displayed once, not echoed as the cell's value


def test_course_scripts_ship_in_the_package_and_unknown_names_say_what_exists():
    assert "train.py" in course_scripts() and script_path("train.py").is_file()
    assert script_path("configs/fsdp_gpu.yaml").is_file()
    with pytest.raises(FileNotFoundError, match="train.py"):
        script_path("nope.py")
    with pytest.raises(ValueError, match="name must be"):
        script_path("../pyproject.toml")


def test_setup_seeds_and_prints_where_launches_run(capsys):
    env = setup(seed=3)
    assert "launch() runs" in capsys.readouterr().out
    assert env == environment() and setup_line(env).startswith(f"torch {env['torch']}")
    assert REPO.count("/") == 1 and __version__.count(".") == 2
    assert os.environ.get("OMP_NUM_THREADS") in (None, "1") or True  # the environment is reported, not changed


# A fresh interpreter (nothing of pytest's imports): the setup cell, then a launch as a lesson's next cell does.
SETUP_THEN_LAUNCH = """
import torch, torch.distributed as dist
from m11_helpers import setup
from m11_helpers.launch import launch
env = setup(seed=0)
print("initialised after setup:", torch.cuda.is_initialized())
if env["gpus"]:
    print(launch(lambda: (torch.ones(1, device="cuda").device.type, dist.get_backend()), num_processes=1,
                 show_output=False, timeout=120))
"""


def test_the_setup_cell_leaves_cuda_uninitialised_in_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", SETUP_THEN_LAUNCH], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "initialised after setup: False" in out.stdout


@pytest.mark.skipif(gpu_count() == 0, reason="needs a visible CUDA GPU (make test hides them: run this file "
                    "with `pytest tests/test_kit.py -k gpu` on a GPU box)")
def test_on_a_gpu_box_a_launch_after_the_setup_cell_gets_its_gpu():
    out = subprocess.run([sys.executable, "-c", SETUP_THEN_LAUNCH], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[('cuda', 'nccl')]" in out.stdout, out.stdout + out.stderr


H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
TWO_GPUS = [("GPU-1a2b", H100), ("GPU-3c4d", A100)]  # (UUID, name) as NVML lists them


def _gpu_box(monkeypatch, visible: int, devices=TWO_GPUS) -> None:
    """Pretend to be a GPU box whose NVML sees `devices`; anything that initialises CUDA raises."""
    import torch

    def poisons_fork(*args, **kwargs):
        raise AssertionError("this initialises CUDA (or poisons fork): no launch() could use CUDA after it")

    monkeypatch.setattr(torch.cuda, "_lazy_init", poisons_fork)  # get_device_name, get_device_properties, …
    monkeypatch.setattr(torch.cuda, "is_available", poisons_fork)  # cudaGetDeviceCount marks later forks bad
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)  # NVML-based: no CUDA initialisation
    monkeypatch.setattr(environment_module, "_nvml_devices", lambda: devices)


def test_setup_and_environment_never_initialise_cuda(monkeypatch, capsys):
    import torch

    _gpu_box(monkeypatch, visible=2, devices=[("GPU-1a2b", H100), ("GPU-3c4d", H100)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    env = setup(seed=0)
    assert env["gpus"] == [H100, H100] and (env["device"], env["backend"], env["default_processes"]) == ("cuda", "nccl", 2)
    assert f"2× {H100} → launch() runs 2 real processes on CUDA with nccl" in capsys.readouterr().out
    assert environment() == env
    assert torch.cuda.is_initialized() is False  # and nothing got past the spies to initialise it
    # a lesson's later torch.cuda.is_available() then counts through NVML too (torch reads this variable)
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


@pytest.mark.parametrize("visible_devices, count, names", [
    (None, 2, [H100, A100]),
    ("1", 1, [A100]),
    ("GPU-3c", 1, [A100]),  # a UUID prefix, as CUDA accepts it
    ("1,0", 2, [A100, H100]),
    ("MIG-5e6f", 1, ["CUDA GPU"]),  # a MIG slice of a mixed box: no name we can vouch for
])
def test_gpu_names_follow_cuda_visible_devices(monkeypatch, visible_devices, count, names):
    _gpu_box(monkeypatch, visible=count)
    if visible_devices is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible_devices)
    assert gpu_names() == names
