"""The launcher: real processes, results in rank order, and every fault ends cleanly."""

import os
import signal
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from m11_helpers.launch import (
    LaunchError,
    LaunchTimeout,
    accelerate_command,
    launch,
    launch_plan,
    launch_script,
    rank_device,
)
from m11_helpers.launch.watch import DRAIN_S, _drain


@pytest.fixture(autouse=True)
def no_process_left_behind():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 5
    while True:
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"


# A failure must be reported when it happens: well before this timeout. Wall-clock bounds below are
# fractions or multiples of the timeout under test, never absolute seconds: a loaded CI machine
# slows everything, and a bound relative to the timeout still tells a prompt error from a hang.
TIMEOUT = 60


def _whoami(offset):
    x = torch.tensor([float(dist.get_rank())], device=rank_device())
    dist.all_reduce(x)
    return dist.get_rank(), dist.get_world_size(), os.getpid(), x.item() + offset


def test_results_come_back_in_rank_order_from_distinct_processes():
    out = launch(_whoami, 10.0, num_processes=4)
    assert [r[0] for r in out] == [0, 1, 2, 3]
    assert all(r[1] == 4 for r in out)
    assert len({r[2] for r in out}) == 4 and os.getpid() not in {r[2] for r in out}
    assert all(r[3] == 0 + 1 + 2 + 3 + 10.0 for r in out)


def test_accelerator_inside_sees_multi_cpu_and_every_rank():
    def fn():
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        acc = Accelerator()
        total = acc.reduce(torch.tensor([1.0], device=acc.device), "sum").item()
        return acc.distributed_type == DistributedType.MULTI_CPU, acc.num_processes, total

    assert launch(fn, num_processes=3) == [(True, 3, 3.0)] * 3


def _cpu_buffer():
    dist.all_reduce(torch.zeros(1))  # gloo takes it; NCCL would not


def test_a_checked_rank_rejects_a_buffer_made_without_a_device(monkeypatch):
    monkeypatch.setenv("M11_DEVICE_CHECK", "1")  # what M11_STRICT=1 (make test) turns on in every rank
    with pytest.raises(LaunchError, match=r"(?s)DeviceError.*test_launch.py:\d+.*No backend type associated"):
        launch(_cpu_buffer, num_processes=2, show_output=False)


def test_output_is_prefixed_and_in_rank_order(capsys):
    launch(lambda: print(f"hello {dist.get_rank()}"), num_processes=3)
    out = capsys.readouterr().out.splitlines()
    assert out == ["[rank 0] hello 0", "[rank 1] hello 1", "[rank 2] hello 2"]


def test_one_thread_per_rank_after_the_parent_used_many():
    torch.set_num_threads(2)
    (torch.randn(256, 256) @ torch.randn(256, 256)).sum()  # the parent's OpenMP pool is live
    assert launch(lambda: (torch.randn(256, 256) @ torch.randn(256, 256), torch.get_num_threads())[1],
                  num_processes=2) == [1, 1]


def test_an_exception_names_its_rank_with_its_traceback():
    def fn():
        if dist.get_rank() == 1:
            raise ValueError("boom on purpose")
        dist.barrier()

    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(fn, num_processes=3, timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT / 2  # reported when it happens, not at the timeout
    msg = str(info.value)
    assert msg.startswith("rank 1 of 3 failed")
    assert "ValueError: boom on purpose" in msg and "[rank 1]" in msg
    assert "in fn" in msg  # the learner's frame is there, the launcher's are not
    assert "_rank_main" not in info.value.failures[1]


def test_a_rank_that_dies_is_reported_with_its_exit_status():
    def fn():
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"(?s)rank 1 of 2 failed.*died \(killed by signal SIGKILL\)"):
        launch(fn, num_processes=2, timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT / 2  # reported when it happens, not at the timeout

    with pytest.raises(LaunchError, match="exited with code 7"):
        launch(lambda: os._exit(7) if dist.get_rank() == 0 else dist.barrier(), num_processes=2, timeout=TIMEOUT)


def test_a_collective_that_never_completes_ends_at_the_timeout():
    def fn():
        if dist.get_rank() == 0:
            dist.barrier()  # rank 1 never joins
        else:
            time.sleep(60)

    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match="did not finish within timeout=3") as info:
        launch(fn, num_processes=2, timeout=3)
    assert 3 <= time.monotonic() - start < 3 * 3  # ends at the timeout, plus a margin proportional to it
    assert "rank 1 was at" in str(info.value)  # where each stuck rank was


def _leaves_a_child_running(own_session: bool):
    import subprocess

    # Inherits the rank's stdout, the launch's output pipe: the pipe stays open while it runs.
    # In a session of its own it is out of the rank's process group too (as torchrun's ranks are).
    return subprocess.Popen(["sleep", "60"], start_new_session=own_session).pid


@pytest.mark.parametrize("own_session", [False, True], ids=["in-the-rank-s-group", "own-session"])
def test_a_child_a_rank_left_running_neither_delays_the_launch_nor_outlives_it(own_session):
    timeout = 20
    start = time.monotonic()
    pids = launch(_leaves_a_child_running, own_session, num_processes=2, timeout=timeout, show_output=False)
    assert time.monotonic() - start < timeout  # not the child's 60 s: the timeout holds
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:  # re-parented to init once its rank exited: init reaps it
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        time.sleep(0.05)
    for pid in alive:  # leave nothing even when the test fails
        psutil.Process(pid).kill()
    assert not alive, "the ranks' children outlived the launch"


def test_draining_output_stops_at_its_deadline_when_a_pipe_stays_open():
    # A child that left its rank's process group (setsid), of a rank killed before it could end it,
    # keeps the output pipe open: the drain keeps what was written and stops at its deadline.
    r, w = os.pipe()
    try:
        os.write(w, b"last words\n")
        output = {0: bytearray()}
        start = time.monotonic()
        _drain([r], {r: 0}, output, start + DRAIN_S)
        assert DRAIN_S <= time.monotonic() - start < 10 * DRAIN_S and output[0] == b"last words\n"
    finally:
        os.close(r), os.close(w)


def test_two_launches_at_once_do_not_clash():
    import threading

    results = {}

    def run(i):
        results[i] = launch(_whoami, float(i), num_processes=2, show_output=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert results[0][0][3] == 1.0 and results[1][0][3] == 2.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_processes=0), "num_processes must be an integer >= 1"),
        (dict(num_processes=2.5), "num_processes must be an integer >= 1"),
        (dict(num_processes=1000), "num_processes=1000 is more than this machine can run"),
        (dict(timeout=0), "timeout must be a finite number > 0"),
        (dict(stall_timeout=float("nan")), "stall_timeout must be a finite number > 0"),
        (dict(device="tpu"), "device must be one of"),
        (dict(mixed_precision="fp8"), "mixed_precision must be one of"),
    ],
)
def test_bad_arguments_say_what_to_pass(kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch(_whoami, 0.0, **kwargs)


def test_a_non_callable_is_refused():
    with pytest.raises(ValueError, match="fn must be a callable"):
        launch("not a function")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cuda_without_gpus_is_refused():
    with pytest.raises(ValueError, match="needs one GPU per process"):
        launch_plan(2, device="cuda")


def _backend():
    return dist.get_backend()


def test_auto_runs_cpu_ranks_when_this_process_already_initialised_cuda(monkeypatch, capsys):
    # A 2-GPU box whose kernel already computed on a GPU (lessons do, on GPU boxes): forks cannot use CUDA.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert launch_plan(2).device == "cuda"  # what auto would pick in a fresh process
    assert launch(_backend, num_processes=2, show_output=False, timeout=TIMEOUT) == ["gloo", "gloo"]
    assert "ranks run on CPU with gloo" in capsys.readouterr().err
    with pytest.raises(LaunchError, match="CUDA was already initialised"):
        launch(_backend, num_processes=2, device="cuda")  # asked for GPUs: say why there are none


SCRIPT = """
import sys, torch
from accelerate import Accelerator
from m11_helpers.launch import report
acc = Accelerator()
total = acc.reduce(torch.tensor([acc.process_index + 1.0], device=acc.device), "sum").item()
if acc.is_main_process:
    print("total", total)
if sys.argv[1:] == ["--fail"] and acc.process_index == 1:
    raise RuntimeError("rank one fails on purpose")
report(rank=acc.process_index, total=total, world=acc.num_processes, kind=str(acc.distributed_type))
acc.end_training()
"""


def test_launch_script_runs_accelerate_launch_on_real_processes(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = launch_script(script, num_processes=2, timeout=120)
    assert run.returncode == 0
    assert [r["rank"] for r in run.results] == [0, 1]
    assert all(r["total"] == 3.0 and r["world"] == 2 and r["kind"] == "DistributedType.MULTI_CPU" for r in run.results)
    out = capsys.readouterr().out
    assert "[rank 0] total 3.0" in out
    assert "accelerate launch --multi_gpu --num_processes 8" in out  # the command for a GPU box


def test_launch_script_failure_names_the_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(LaunchError, match=r"failed \(exit code \d+\) on rank 1") as info:
        launch_script(script, "--fail", num_processes=2, timeout=120, echo=False)
    assert "rank one fails on purpose" in str(info.value)


def test_launch_script_timeout_kills_the_tree(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nfrom accelerate import Accelerator\nAccelerator()\ntime.sleep(120)\n")
    start = time.monotonic()
    with pytest.raises(LaunchTimeout):
        launch_script(script, num_processes=2, timeout=8, echo=False)
    assert 8 <= time.monotonic() - start < 2 * 8  # ends at the timeout, plus a margin proportional to it


def test_launch_script_refuses_a_missing_file():
    with pytest.raises(ValueError, match="script must be an existing file"):
        launch_script("no/such/script.py")


def test_two_nodes_of_two_processes_train_as_one_job(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = launch_script(script, num_processes=2, num_machines=2, timeout=180, echo=False)
    assert [r["rank"] for r in run.results] == [0, 1, 2, 3]
    assert all(r["world"] == 4 and r["total"] == 1 + 2 + 3 + 4 for r in run.results)
    assert "--machine_rank" in run.command and "--num_machines" in run.command


CRASH_ONCE = """
import os, sys
from pathlib import Path
import torch.distributed as dist
from m11_helpers.launch import report
dist.init_process_group("gloo")
marker = Path(sys.argv[1])
if dist.get_rank() == 1 and not marker.exists():  # the first attempt only: a crash, as a preempted node
    marker.write_text("crashed once")
    sys.exit(3)
dist.barrier()
report(attempt=int(os.environ["TORCHELASTIC_RESTART_COUNT"]))
dist.destroy_process_group()
"""


def test_an_elastic_restart_recovers_from_a_crashed_rank_and_is_counted(tmp_path):
    script = tmp_path / "crash_once.py"
    script.write_text(CRASH_ONCE)
    run = launch_script(script, tmp_path / "marker", num_processes=2, max_restarts=1, timeout=120, echo=False)
    assert run.returncode == 0 and run.restarts == 1
    assert run.results == [{"attempt": 1}, {"attempt": 1}]  # both ranks finished in the restarted group
    assert "exitcode: 3" in run.output  # the first attempt's crash is in the log
    assert run.command[run.command.index("--max_restarts") + 1] == "1"


def test_max_restarts_is_validated_and_shown_in_the_command():
    assert accelerate_command("t.py", num_processes=2, max_restarts=2)[-5:] == [
        "--max_restarts", "2", "--rdzv_backend", "c10d", "t.py"]
    with pytest.raises(ValueError, match="max_restarts must be an integer >= 0"):
        accelerate_command("t.py", num_processes=2, max_restarts=-1)
    with pytest.raises(ValueError, match="max_restarts=1 needs num_processes"):
        launch_script(__file__, num_processes=1, max_restarts=1)
