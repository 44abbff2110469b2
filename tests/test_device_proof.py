"""The CPU-side proof of device discipline (m11_helpers.device_lint, m11_helpers.device_check) and the kit's
accelerator-aware pieces (timing.synchronize, device_state), GPU paths exercised with a fake CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from m11_helpers import device_state, timing
from m11_helpers.device_check import DeviceError, checked, origin
from m11_helpers.device_lint import course_files, lint_paths, lint_source

PLANTED = '''
import time, torch, torch.distributed as dist

def bad_buffer(x):
    out = torch.empty(4)
    dist.all_reduce(out)

def good_buffer(x):
    out = x.new_empty(4)
    moved = torch.randn(4, generator=torch.Generator()).to(x.device)
    dist.all_reduce(out); dist.all_reduce(moved)

def opted_out(x):
    out = torch.zeros(4)  # m11: cpu-only - a gloo side group for CPU metadata
    dist.all_reduce(out, group=cpu_group)

def bad_rng(block, x):
    state = torch.get_rng_state()
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        return block(x)

def bad_timing(model, x):
    t0 = time.perf_counter()
    model(x).sum().backward()
    return time.perf_counter() - t0

def good_timing(model, x):
    t0 = time.perf_counter()
    model(x).sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - t0

def bad_memory(model, x):
    import tracemalloc
    tracemalloc.start()
    model(x).sum().backward()
    return tracemalloc.get_traced_memory()[1]

def bad_chosen_factory(x, traced):
    out = (torch.zeros if traced else torch.empty)(4)
    dist.all_reduce(out)
'''


def test_each_lint_rule_fires_on_its_planted_mistake_and_only_there():
    found = {(f.line, f.rule) for f in lint_source(PLANTED, "planted.py")}
    assert found == {(5, "factory-no-device"), (18, "rng-cpu-only"), (19, "rng-cpu-only"), (20, "rng-cpu-only"),
                     (24, "timing-unsynced"), (36, "memory-cpu-only"), (41, "factory-no-device")}


def test_the_package_scripts_notebooks_and_wrong_answers_are_clean():
    files = course_files()
    assert len(files) > 100 and any(f.suffix == ".ipynb" for f in files)  # it looked where ranks run
    assert [str(f) for f in lint_paths(files)] == []


def test_a_device_less_buffer_fails_its_collective_with_the_nccl_error_and_where_it_was_made():
    x = torch.ones(3)  # the data (made before the check: stands for a tensor on the rank's device)
    with checked():
        bad = torch.zeros(3).float().view(3)  # tagged, and the tag follows views and casts
        line = f"{__file__}:{sys._getframe().f_lineno - 1}"
        assert origin(bad) == line
        for call in (lambda: dist.all_reduce(bad), lambda: dist.all_gather([x.clone(), x.clone()], bad),
                     lambda: dist.batch_isend_irecv([SimpleNamespace(op=dist.irecv, tensor=bad)]),  # a P2POp's
                     lambda: dist.isend(list(bad.chunk(3))[1], 1),  # its pieces too
                     lambda: dist.all_reduce(bad.new_zeros(1))):  # new_* of a CPU buffer is one too
            with pytest.raises(DeviceError, match=r"No backend type associated with device type cpu.*x\.new_empty"):
                call()
        fine = [x.new_empty(3), torch.zeros_like(x), torch.zeros(3, device=x.device), torch.zeros(3).to(x.device),
                x + torch.tensor(1.0)]  # the last: a GPU result (a CPU scalar joins the data's device)
        for t in fine:
            assert origin(t) is None
            with pytest.raises(ValueError, match="Default process group has not been initialized"):
                dist.all_reduce(t)  # past the check, into torch (no process group in this test)
    assert origin(torch.zeros(1)) is None  # outside the block nothing is tagged


def test_a_group_made_for_the_cpu_takes_cpu_tensors(monkeypatch):
    from m11_helpers import device_check

    class Group:  # stands for new_group(backend="gloo"): a CPU channel under NCCL too
        def allreduce(self, *args):
            raise LookupError("the group's own all-reduce")

    side = Group()
    monkeypatch.setattr(device_check, "_cpu_groups", [side])
    with checked():
        with pytest.raises(LookupError):
            dist.all_reduce(torch.zeros(1), group=side)  # past the check, into the group
        with pytest.raises(DeviceError):
            dist.all_reduce(torch.zeros(1), group=Group())  # any other group: checked


def test_a_script_rank_is_checked_when_it_imports_the_launch_package():
    code = ("import torch.distributed as d, m11_helpers.launch; "
            "print(getattr(d.all_reduce, '__m11_checked__', False))")
    env = dict(os.environ, M11_STRICT="1", M11_RESULTS_DIR="/nonexistent", LOCAL_RANK="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


class FakeCuda:
    """Stands in for torch.cuda on a CPU machine: records what the kit asks of it."""

    def __init__(self, monkeypatch):
        self.calls, self.gen = [], [torch.tensor([1, 2], dtype=torch.uint8)]
        for name, fn in {"is_initialized": lambda: True, "is_available": lambda: True, "synchronize": lambda *a: self.calls.append("sync"),
                         "get_rng_state_all": lambda: [g.clone() for g in self.gen],
                         "set_rng_state_all": lambda states: self.calls.append(("set", [s.tolist() for s in states])),
                         "reset_peak_memory_stats": lambda d=None: self.calls.append("reset"),
                         "memory_allocated": lambda d=None: 100,
                         "max_memory_allocated": lambda d=None: 612}.items():
            monkeypatch.setattr(torch.cuda, name, fn)


def test_the_timer_synchronises_the_accelerator_around_every_timed_call(monkeypatch):
    fake = FakeCuda(monkeypatch)
    timing.time_it(lambda: None, repeats=3, warmup=1)
    assert fake.calls == ["sync"] * 6  # before and after each of the 3 timed calls
    fake.calls.clear()
    timing.time_it(lambda: None, repeats=2, sync=None)  # opting out: the launch alone
    assert fake.calls == []


def test_rng_capture_and_restore_cover_the_gpu_generators(monkeypatch):
    fake = FakeCuda(monkeypatch)
    state = device_state.rng_state()
    assert [s.tolist() for s in state["cuda"]] == [[1, 2]]
    torch.rand(3)  # the CPU generator moves on
    with device_state.fork_rng():
        torch.rand(3)
    device_state.set_rng_state(state)
    assert torch.equal(torch.get_rng_state(), state["torch"])
    assert fake.calls == [("set", [[1, 2]])] * 2  # fork_rng's restore, then ours


def test_rng_state_on_cpu_alone_and_memory_reads_the_gpu_allocator(monkeypatch):
    state = device_state.rng_state()
    assert state["cuda"] == [] and device_state.allocated_bytes("cpu") is None
    assert device_state.peak_bytes(lambda: None, "cpu") is None
    fake = FakeCuda(monkeypatch)
    assert device_state.allocated_bytes("cuda") == 100
    assert device_state.peak_bytes(lambda: fake.calls.append("fn"), "cuda") == 512
    assert fake.calls == ["sync", "reset", "fn", "sync"]
