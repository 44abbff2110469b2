"""What checks see of *how*: each rank's communication calls (op, peer, bytes), and forbidden library calls."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import isend as imported_isend  # an alias bound before recording starts

from m11_helpers.grading.observe import ForbiddenCall, forbid, record_comm
from m11_helpers.launch import launch


def _ring_step_and_collectives():
    rank, n = dist.get_rank(), dist.get_world_size()
    with record_comm() as log:
        t = torch.ones(4)
        dist.all_reduce(t)
        req = imported_isend(torch.ones(3), (rank + 1) % n)
        buf = torch.zeros(3)
        dist.recv(buf, (rank - 1) % n)
        req.wait()
        out = torch.zeros(4 * n)
        dist.all_gather_single(out, torch.ones(4))
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
