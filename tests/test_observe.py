"""What checks see of *how*: each rank's communication calls (op, peer, bytes), and forbidden library calls."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import isend as imported_isend  # an alias bound before recording starts

from m11_helpers.grading.observe import ForbiddenCall, forbid, record_comm, record_overlap
from m11_helpers.launch import launch, rank_device


def _ring_step_and_collectives():
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = rank_device()  # NCCL takes no CPU buffer
    with record_comm() as log:
        t = torch.ones(4, device=dev)
        dist.all_reduce(t)
        req = imported_isend(torch.ones(3, device=dev), (rank + 1) % n)
        buf = torch.zeros(3, device=dev)
        dist.recv(buf, (rank - 1) % n)
        req.wait()
        out = torch.zeros(4 * n, device=dev)
        dist.all_gather_single(out, torch.ones(4, device=dev))
    return log


def test_record_comm_sees_peers_bytes_and_collectives_on_real_ranks():
    logs = launch(_ring_step_and_collectives, num_processes=3, show_output=False)
    for rank, log in enumerate(logs):
        assert log.ops() == ["all_reduce", "isend", "recv", "all_gather_single"]
        assert log.peers("isend") == {(rank + 1) % 3} and log.peers("recv") == {(rank - 1) % 3}
        assert log.bytes("isend") == 12 and log.bytes("all_reduce") == 16
        assert log.collectives() == {"all_reduce", "all_gather_single"}
        assert [e.async_op for e in log.events] == [False, True, False, False]


def test_forbid_catches_python_and_builtin_functions_under_any_name():
    from torch.nn.utils import clip_grad_norm_ as alias

    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    for call, name in ((lambda: alias([p], 1.0), "clip_grad_norm_"),
                       (lambda: F.scaled_dot_product_attention(*[torch.ones(1, 1, 2, 2)] * 3),
                        "scaled_dot_product_attention")):
        try:
            with forbid(torch.nn.utils.clip_grad_norm_, F.scaled_dot_product_attention, why="write it yourself"):
                call()
        except ForbiddenCall as e:
            assert name in str(e) and "write it yourself" in str(e)
        else:
            raise AssertionError(f"{name} was not caught")
    with forbid(torch.nn.utils.clip_grad_norm_):
        torch.linalg.vector_norm(torch.ones(3))  # other calls are fine


# ---------------------------------------------------------------- overlap, deadlock, crash in mid-save

def _backward_with_hooks(overlap: bool):
    """Two gradient buckets; the hooks all-reduce each bucket as soon as it is ready (overlap) or after backward."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    params, pending = list(model.parameters()), []
    buckets = [params[2:], params[:2]]  # backward produces the last layer's gradients first

    def launch_bucket(bucket):
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])  # (bucket numel,)
        pending.append(dist.all_reduce(flat, async_op=True))

    if overlap:  # launch a bucket once all its gradients are accumulated
        for bucket in buckets:
            left = [len(bucket)]

            def ready(_p, b=bucket, left=left):
                left[0] -= 1
                if left[0] == 0:
                    launch_bucket(b)

            for p in bucket:
                p.register_post_accumulate_grad_hook(ready)
    with record_overlap(model) as ov:
        model(torch.ones(4, 8)).sum().backward()
        if not overlap:
            for bucket in buckets:
                launch_bucket(bucket)
        for work in pending:
            work.wait()
    return len(ov.during_backward("all_reduce")), len(ov.after_backward("all_reduce")), len(ov.ready)


def test_record_overlap_tells_communication_during_backward_from_after_it():
    for overlap, (during, after) in ((True, (2, 0)), (False, (0, 2))):
        for got in launch(_backward_with_hooks, overlap, num_processes=2, show_output=False):
            assert got == (during, after, 4), (overlap, got)  # calls made from gradient hooks are during backward


def _exchange(message, blocking_first: bool):
    rank = dist.get_rank()
    peer, buf = 1 - rank, torch.empty_like(message)
    if blocking_first:
        dist.send(message, peer)  # both ranks send first: neither reaches its receive
        dist.recv(buf, peer)
    else:
        req = dist.isend(message, peer)
        dist.recv(buf, peer)
        req.wait()
    return float(buf[1] - buf[0]), float(buf[0])


def _spin(message, seconds: float):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # computing, never waiting: uses CPU all along
        pass
    return float(message[0])


def test_expect_no_deadlock_names_a_blocking_send_and_passes_a_posted_one():
    from m11_helpers.grading.faults import DEADLOCK, STALL_S, expect_no_deadlock

    got = expect_no_deadlock(_exchange, False, exercise="9.9", timeout=60)
    assert got == [(1.0, 1e6), (1.0, 0.0)]  # each rank received its peer's 8 MiB message
    start = time.monotonic()
    with pytest.raises(AssertionError) as caught:
        expect_no_deadlock(_exchange, True, exercise="9.9", timeout=120)
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"Exercise 9.9: {DEADLOCK}: every rank sat idle, waiting, for {STALL_S:g} s "
                            "with a 8 MiB message"), first
    assert "rank 0 in send" in first and "rank 1 in send" in first
    # told by the ranks' idle CPU, not by the clock: well before the timeout under test
    assert time.monotonic() - start < 120 / 4


def test_ranks_that_compute_are_not_a_deadlock_and_a_busy_hang_meets_the_timeout():
    from m11_helpers.grading.faults import STALL_S, expect_no_deadlock

    # computing for longer than the stall limit is progress, not a deadlock
    assert expect_no_deadlock(_spin, STALL_S + 2, exercise="9.9", nbytes=64, timeout=60) == [0.0, 1e6]
    with pytest.raises(AssertionError, match=r"the ranks hung \(a deadlock or a loop\): still waiting after 3 s"):
        expect_no_deadlock(_spin, 600, exercise="9.9", nbytes=64, timeout=3)


def test_crash_during_save_tells_an_atomic_save_from_one_in_place(tmp_path):
    from m11_helpers.fault_tolerance import atomic_save, naive_save
    from m11_helpers.grading.faults import crash_during_save, expect_atomic_save

    good = expect_atomic_save(atomic_save, tmp_path / "a" / "ckpt.pt", exercise="10.2", kills=4)
    assert good.ok and good.clean_run == "new" and not good.in_place and good.leftovers == []
    assert set(good.outcomes) <= {"old", "new"} and len(good.outcomes) == 4
    bad = crash_during_save(naive_save, tmp_path / "b" / "ckpt.pt", kills=2)
    assert bad.clean_run == "new" and bad.in_place and not bad.ok  # caught when it opened ckpt.pt, every time
    assert "torn" in bad.outcomes or "missing" in bad.outcomes
    try:
        expect_atomic_save(naive_save, tmp_path / "c" / "ckpt.pt", exercise="10.2", kills=1)
    except AssertionError as e:
        assert str(e).startswith("Exercise 10.2: not crash-safe: the save opened ckpt.pt itself for writing"), str(e)
    else:
        raise AssertionError("an in-place save passed")


def test_record_renames_sees_os_replace_and_os_rename_inside_the_block_only(tmp_path):
    import os

    from m11_helpers.grading.observe import record_renames

    (tmp_path / "a").write_text("x")
    with record_renames() as moves:
        os.replace(tmp_path / "a", tmp_path / "b")  # a PathLike
        os.rename(str(tmp_path / "b"), str(tmp_path / "c"))  # a str
        with record_renames() as inner:  # nested blocks each see what happens inside them
            os.replace(tmp_path / "c", tmp_path / "d")
    os.replace(tmp_path / "d", tmp_path / "e")  # after the block: not recorded
    assert moves == [(str(tmp_path / "a"), str(tmp_path / "b")), (str(tmp_path / "b"), str(tmp_path / "c")),
                     (str(tmp_path / "c"), str(tmp_path / "d"))]
    assert inner == [(str(tmp_path / "c"), str(tmp_path / "d"))]
