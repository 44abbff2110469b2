"""Lesson 02: how many message times in a row a point-to-point algorithm takes — its critical path, in messages.

    with record_p2p() as trace:          # in a rank: every send posted, every receive completed, in order
        my_ring_reduce_scatter(x)
    message_depth([t0, t1, t2, t3])      # 3 = N-1: the N messages of each step travel at the same time

A ring's N-1 steps each move N messages, one per link. Run concurrently (every rank posts its send,
then waits for its receive) a step costs one message time, and the reduce-scatter N-1: the α–β cost
(N-1)·(α + S/N·β). Serialized (a rank waits for its left neighbour's message before it sends its
own) the messages of one step follow each other round the ring, and the whole takes N·(N-1) message
times: the same bytes, N× the time. Which of the two a rank does is its program order, so the count
below needs no clock: a message's depth is one more than the depth of what its sender had received
before posting it (Lamport 1978, "happened before"); the critical path is the deepest receive.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Iterator

__all__ = ["record_p2p", "message_depth"]

_P2P = ("send", "isend", "recv", "irecv")


@contextlib.contextmanager
def record_p2p() -> Iterator[list[tuple[str, int]]]:
    """Record this thread's point-to-point messages in program order: ("send", dst) when a send is posted,
    ("recv", src) when a receive has completed (dist.recv returned, or an irecv's work.wait() returned)."""
    import torch.distributed as dist

    codes = {inspect.unwrap(getattr(dist, name)).__code__: name for name in _P2P}
    trace: list[tuple[str, int]] = []
    pending: list = []  # (Work, source) of each irecv not yet seen complete
    depth = [0]  # >0 inside a recorded call (dist.send calls isend, dist.recv may wait): one event each

    def profile(frame, event, arg):
        name = codes.get(frame.f_code)
        if name and event == "call":
            if depth[0] == 0 and name in ("send", "isend"):
                trace.append(("send", _peer(frame, "dst")))
            depth[0] += 1
        elif name and event == "return":
            depth[0] -= 1
            if depth[0] == 0 and name == "recv":
                trace.append(("recv", _peer(frame, "src")))
            elif depth[0] == 0 and name == "irecv" and arg is not None:
                pending.append((arg, _peer(frame, "src")))
        elif event == "c_return" and depth[0] == 0 and pending and getattr(arg, "__name__", "") == "wait":
            # a profile hook sees the unbound pybind method, not its Work: a wait() that returns is where
            # the rank has learnt of every irecv complete by then (its own, or one that came meanwhile);
            # under NCCL wait() only orders the GPU stream, so there it stands for the oldest irecv pending
            done = [w for w in pending if w[0].is_completed()] or ([pending[0]] if dist.get_backend() != "gloo" else [])
            for work, src in done:
                pending.remove((work, src))
                trace.append(("recv", src))

    previous = sys.getprofile()

    def both(frame, event, arg):
        profile(frame, event, arg)
        return previous(frame, event, arg) if previous else None

    sys.setprofile(both)
    try:
        yield trace
    finally:
        sys.setprofile(previous)
        trace.extend(("recv", src) for _, src in pending)  # never seen complete: they did arrive, by the end


def _peer(frame, arg: str) -> int:
    """The global rank a send goes to / a receive comes from (group_dst / group_src mapped through the group)."""
    import torch.distributed as dist

    args = frame.f_locals
    peer = args.get(arg)
    if peer is None and args.get(f"group_{arg}") is not None:
        peer = dist.get_global_rank(args.get("group"), args[f"group_{arg}"])
    return -1 if peer is None else int(peer)


def message_depth(traces: list[list[tuple[str, int]]]) -> int:
    """The longest chain of messages each waiting for the one before (0 without messages).

    traces[r] is rank r's record_p2p() list. The k-th send from r to p is the k-th receive on p from r
    (point-to-point messages between two ranks arrive in order). depth(send) = the deepest receive its
    rank completed before posting it; depth(receive) = max(its rank's deepest so far, depth(send) + 1).
    """
    sends: dict[tuple[int, int], list[int]] = {}  # (src, dst) -> depth of each send, in order
    done: dict[int, int] = dict.fromkeys(range(len(traces)), 0)  # events of each rank processed
    depth = [0] * len(traces)  # each rank's deepest completed receive so far
    deepest, progress = 0, True
    while progress:  # replay the ranks together: a receive waits until its send has been replayed
        progress = False
        for r, trace in enumerate(traces):
            while done[r] < len(trace):
                kind, peer = trace[done[r]]
                if kind == "send":
                    sends.setdefault((r, peer), []).append(depth[r])
                else:
                    seen = sum(1 for k, p in trace[:done[r]] if k == "recv" and p == peer)
                    sent = sends.get((peer, r), [])
                    if seen >= len(sent):
                        break  # its message is not posted yet in the replay: go on with the other ranks
                    depth[r] = max(depth[r], sent[seen] + 1)
                    deepest = max(deepest, depth[r])
                done[r] += 1
                progress = True
    return deepest
