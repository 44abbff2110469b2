"""What a check sees of *how* a learner's code works: who sent what to whom, which collectives ran, which calls it made.

Inside a rank (in a check cell's rank function):

    with record_comm() as log:
        out = ring_all_reduce(t)
    log.ops()                     # ['isend', 'irecv', 'isend', ...] in call order
    log.peers("isend")            # {1}: every isend went to rank 1 (the right-hand neighbour)
    log.bytes("all_reduce")       # bytes of the tensors this rank passed to all_reduce (its shard, for an all-gather)
    log.events[0].group           # (0, 2): the global ranks of the group= it was given (None: the default group)

    with forbid(torch.nn.utils.clip_grad_norm_, why="write the clipping yourself"):
        clip(model.parameters(), 1.0)   # raises ForbiddenCall if the library function runs

    with record_overlap(model) as ov:   # DDP overlap: did communication start DURING backward?
        loss.backward()                 # (the learner's gradient hooks launch all-reduces)
        finish_gradient_sync(model)
    ov.during_backward("all_reduce")    # the calls made before the last gradient was ready

Both watch calls with `sys.setprofile`, by *code object* (Python functions) or identity (built-ins):
they see a call however the function was reached (`dist.isend`, `from torch.distributed import isend`,
an alias), which patching module attributes would not. Collectives are recorded at the outermost
`torch.distributed` function (a `send` that calls an internal `isend` is one `send`); a call made
straight on a ProcessGroup object (`group.allreduce(...)`) is recorded under its own name.
Per thread: install them in the thread that runs the learner's code (a rank's main thread; on CPU
autograd runs gradient hooks in the thread that called backward, so `record_overlap` sees them).
Deadlocks (a large message) and crashes in mid-save are provoked by `m11_helpers.grading.faults`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import time
from typing import Any, Callable, Iterator

__all__ = ["CommEvent", "CommLog", "record_comm", "ForbiddenCall", "forbid", "COMM_FUNCTIONS", "Overlap",
           "record_overlap", "record_renames"]

# torch.distributed functions a lesson may ask about, with the argument that holds the peer.
COMM_FUNCTIONS = {
    "send": "dst", "recv": "src", "isend": "dst", "irecv": "src", "broadcast": "src", "reduce": "dst",
    "all_reduce": None, "all_gather": None, "all_gather_into_tensor": None, "all_gather_single": None,
    "reduce_scatter": None, "reduce_scatter_tensor": None, "reduce_scatter_single": None,
    "all_to_all": None, "all_to_all_single": None, "gather": "dst", "scatter": "src", "barrier": None,
    "all_gather_object": None, "broadcast_object_list": "src",
}
# the argument whose bytes count as "what this rank contributes"
_PAYLOAD = {"all_gather_into_tensor": "input_tensor", "all_gather_single": "input_tensor",
            "reduce_scatter_tensor": "input", "reduce_scatter_single": "input", "all_to_all_single": "input",
            "all_gather": "tensor", "reduce_scatter": "input_list", "all_to_all": "input_tensor_list",
            "gather": "tensor", "scatter": "scatter_list"}
_PG_METHODS = {"allreduce", "allgather", "_allgather_base", "reduce_scatter", "_reduce_scatter_base", "alltoall",
               "alltoall_base", "send", "recv", "recv_anysource", "broadcast", "reduce", "gather", "scatter",
               "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "allreduce_coalesced"}


@dataclasses.dataclass(frozen=True)
class CommEvent:
    """One communication call on this rank: its name, the peer (global rank) for point-to-point, bytes."""

    op: str
    peer: int | None
    nbytes: int  # payload: the bytes of the tensor this rank passed (its shard for an all-gather; comm_count)
    async_op: bool
    t: float = 0.0  # time.perf_counter() when the call was made
    group: tuple[int, ...] | None = None  # global ranks of the process group passed (None: the default group)


def _nbytes(x: Any) -> int:
    if hasattr(x, "element_size") and hasattr(x, "numel"):
        return int(x.element_size() * x.numel())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


@dataclasses.dataclass
class CommLog:
    """The communication calls made inside one `record_comm()` block, in order."""

    events: list[CommEvent] = dataclasses.field(default_factory=list)

    def ops(self) -> list[str]:
        return [e.op for e in self.events]

    def count(self, op: str) -> int:
        return sum(e.op == op for e in self.events)

    def peers(self, *ops: str) -> set[int]:
        return {e.peer for e in self.events if e.op in ops and e.peer is not None}

    def bytes(self, *ops: str) -> int:
        """Bytes this rank passed to `ops` (all ops when none is named)."""
        return sum(e.nbytes for e in self.events if not ops or e.op in ops)

    def collectives(self) -> set[str]:
        """Names of the calls that were not point-to-point."""
        return {e.op for e in self.events if e.op not in ("send", "recv", "isend", "irecv")}


def _targets() -> dict[Any, str]:
    """code object -> public name, for the innermost function of each torch.distributed call."""
    import torch.distributed as dist

    out = {}
    for name in COMM_FUNCTIONS:
        fn = getattr(dist, name, None)
        if fn is not None:
            out[inspect.unwrap(fn).__code__] = name
    return out


def _event(name: str, frame) -> CommEvent:
    args = frame.f_locals
    peer_arg = COMM_FUNCTIONS.get(name)
    peer = args.get(peer_arg) if peer_arg else None
    if peer is None and peer_arg and args.get(f"group_{peer_arg}") is not None:
        import torch.distributed as dist

        peer = dist.get_global_rank(args.get("group"), args[f"group_{peer_arg}"])
    payload = args.get(_PAYLOAD.get(name, "tensor"))
    async_op = name in ("isend", "irecv") or bool(args.get("async_op", False))
    return CommEvent(name, None if peer is None else int(peer), _nbytes(payload), async_op, time.perf_counter(),
                     _group_ranks(args.get("group")))


def _group_ranks(group: Any) -> tuple[int, ...] | None:
    """The global ranks of a process group argument; None for the default group (or one we cannot read)."""
    if group is None:
        return None
    import torch.distributed as dist

    try:
        return tuple(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - an object that is not a group: the call itself will complain
        return None


def _chain(previous, ours):
    """A profile function that runs ours, then whatever was installed before (a debugger, say)."""
    if previous is None:
        return ours

    def both(frame, event, arg):
        ours(frame, event, arg)
        return previous(frame, event, arg)

    return both


@contextlib.contextmanager
def record_comm() -> Iterator[CommLog]:
    """Record every torch.distributed communication call made in this thread inside the block."""
    targets, log = _targets(), CommLog()
    depth = [0]  # >0 while inside a recorded call: its internal calls are not separate events

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in targets:
            if depth[0] == 0:
                log.events.append(_event(targets[frame.f_code], frame))
            depth[0] += 1
        elif event == "return" and frame.f_code in targets:
            depth[0] -= 1
        elif event == "c_call" and depth[0] == 0 and getattr(arg, "__name__", "") in _PG_METHODS \
                and type(getattr(arg, "__self__", None)).__name__.startswith("ProcessGroup"):
            log.events.append(CommEvent(f"ProcessGroup.{arg.__name__}", None, 0, True, time.perf_counter()))

    previous = sys.getprofile()
    sys.setprofile(_chain(previous, profile))
    try:
        yield log
    finally:
        sys.setprofile(previous)


class ForbiddenCall(AssertionError):
    """The learner's code called a library function the exercise asks them to write."""


def _label(fn: Callable) -> str:
    mod = getattr(fn, "__module__", None) or ""
    return f"{mod}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}".lstrip(".")


@contextlib.contextmanager
def forbid(*fns: Callable, why: str = "") -> Iterator[None]:
    """Raise `ForbiddenCall` the moment any of `fns` is called in this thread inside the block."""
    codes = {inspect.unwrap(f).__code__: f for f in fns if hasattr(inspect.unwrap(f), "__code__")}
    builtins_ = {id(f): f for f in fns if not hasattr(inspect.unwrap(f), "__code__")}

    def profile(frame, event, arg):
        hit = None
        if event == "call" and frame.f_code in codes:
            hit = codes[frame.f_code]
        elif event == "c_call" and id(arg) in builtins_:
            hit = builtins_[id(arg)]
        if hit is not None:
            sys.setprofile(previous)  # report once, with the profiler gone
            raise ForbiddenCall(f"called {_label(hit)}" + (f": {why}" if why else ""))

    previous = sys.getprofile()
    sys.setprofile(_chain(previous, profile))
    try:
        yield
    finally:
        sys.setprofile(previous)


@dataclasses.dataclass
class Overlap:
    """One rank's backward: when each gradient was ready, and the communication calls made meanwhile."""

    ready: list[float] = dataclasses.field(default_factory=list)  # perf_counter() as each .grad was accumulated
    comm: list[CommEvent] = dataclasses.field(default_factory=list)

    @property
    def backward_end(self) -> float:
        """When the last gradient was accumulated (inf before any was)."""
        return max(self.ready, default=float("inf"))

    def during_backward(self, *ops: str) -> list[CommEvent]:
        """The calls (of `ops`, or all) made before the last gradient was ready: communication that overlaps.

        A call made from a gradient hook counts, even the one the last gradient's hook makes (the hooks
        of `record_overlap` run after those the learner registered before it).
        """
        return [e for e in self.comm if (not ops or e.op in ops) and e.t < self.backward_end]

    def after_backward(self, *ops: str) -> list[CommEvent]:
        return [e for e in self.comm if (not ops or e.op in ops) and e.t >= self.backward_end]


@contextlib.contextmanager
def record_overlap(model) -> Iterator[Overlap]:
    """Record when each of `model`'s gradients is accumulated and every communication call, in this thread."""
    ov = Overlap()
    hooks = [p.register_post_accumulate_grad_hook(lambda _p: ov.ready.append(time.perf_counter()))
             for p in model.parameters() if p.requires_grad]
    try:
        with record_comm() as log:
            ov.comm = log.events
            yield ov
    finally:
        for h in hooks:
            h.remove()


_RENAME_LOGS: list[list[tuple[str, str]]] = []  # one per open record_renames block


def _audit_renames(event: str, args: tuple) -> None:
    if event == "os.rename" and _RENAME_LOGS:  # os.rename and os.replace raise this one audit event
        move = (os.fsdecode(args[0]), os.fsdecode(args[1])) if isinstance(args[0], (str, bytes, os.PathLike)) \
            and isinstance(args[1], (str, bytes, os.PathLike)) else (repr(args[0]), repr(args[1]))
        for log in _RENAME_LOGS:
            log.append(move)


@contextlib.contextmanager
def record_renames() -> Iterator[list[tuple[str, str]]]:
    """(src, dst) of every os.rename / os.replace made inside the block, in any thread (audit event "os.rename").

    An audit hook cannot be removed: one is installed, once, and records only while a block is open.
    Used to see where an "atomic" save wrote its temporary file (a rename is atomic within one filesystem only).
    """
    if not getattr(_audit_renames, "installed", False):  # a flag on the function, not a module global that
        sys.addaudithook(_audit_renames)  # the grader's tamper guard would see change
        _audit_renames.installed = True
    log: list[tuple[str, str]] = []
    _RENAME_LOGS.append(log)
    try:
        yield log
    finally:
        _RENAME_LOGS[:] = [other for other in _RENAME_LOGS if other is not log]
