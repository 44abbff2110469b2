"""One way to count communication (kit): per collective, its calls, payload bytes, wire bytes and elements.

    COMM = CommCounter()                                          # a lesson module's counter (tensor_parallel.COMM)
    COMM.add("all_reduce", payload=S, wire=bus_factor("all_reduce", n) * S, elements=x.numel())  # S = x's bytes
    COMM.calls("all_reduce"), COMM.payload("all_reduce"), COMM.wire("all_reduce")    # since the last clear()
    COMM.table()                                                  # {"all_reduce": {"calls", "payload", "wire", …}}

Two byte counts, named apart, because the lessons state both:

- **payload**: the bytes of the tensor this rank hands to the call — the tensor all-reduced; its
  shard, for an all-gather; its full input, for a reduce-scatter; its whole send buffer (rows for
  every rank, itself included), for an all-to-all; the message, point to point. This is what
  `m11_helpers.grading.observe.record_comm` records for each call (`CommEvent.nbytes`).
- **wire**: the bytes this rank puts on links to other ranks. For a ring of N ranks it is nccl-tests'
  bus factor times the collective's size S (doc/PERFORMANCE.md, "Bus bandwidth"; `comm_model.bus_factor`),
  S being the tensor all-reduced, the gathered output, the reduce-scatter's input: all-reduce
  2(N−1)/N·S (reduce-scatter then all-gather; Patarasuk & Yuan 2009, the lower bound), all-gather
  and reduce-scatter (N−1)/N·S. An all-to-all sends its payload minus the rows it keeps.

`elements` counts the values of S, as ZeRO's accounting of Ψ does (Rajbhandari et al. 2020, §7); 0 where
the caller does not count them (`hsdp` builds its counter from record_comm's events, which hold bytes only).
The caller knows the algorithm and the group, so it passes all three: the kit states no formula
(`comm_model` owns them).
"""

from __future__ import annotations

import dataclasses

from m11_helpers.validate import non_negative_real

__all__ = ["CommCounter", "Tally"]


@dataclasses.dataclass
class Tally:
    """What one op added up to: calls, payload bytes, wire bytes, elements of the collective's size S."""

    calls: int = 0
    payload: float = 0
    wire: float = 0
    elements: int = 0


class CommCounter:
    """Calls, payload and wire bytes per op name, since the last `clear()`."""

    def __init__(self) -> None:
        self.ops: dict[str, Tally] = {}

    def add(self, op: str, payload: float, wire: float, elements: int = 0) -> None:
        """One call of `op`: this rank passed `payload` bytes, sent `wire` bytes, over a collective of `elements`."""
        non_negative_real("payload", payload)
        non_negative_real("wire", wire)
        t = self.ops.setdefault(op, Tally())
        t.calls += 1
        t.payload += payload
        t.wire += wire
        t.elements += elements

    def clear(self) -> None:
        self.ops.clear()

    def _sum(self, field: str, ops: tuple[str, ...]) -> float:
        return sum(getattr(t, field) for op, t in self.ops.items() if not ops or op in ops)

    def calls(self, *ops: str) -> int:
        """Calls of `ops` (of every op when none is named)."""
        return int(self._sum("calls", ops))

    def payload(self, *ops: str) -> float:
        """Bytes this rank passed to `ops` (all when none is named)."""
        return self._sum("payload", ops)

    def wire(self, *ops: str) -> float:
        """Bytes this rank sent to other ranks in `ops` (all when none is named)."""
        return self._sum("wire", ops)

    def elements(self, *ops: str) -> int:
        """Elements of the collectives' size S in `ops` (all when none is named)."""
        return int(self._sum("elements", ops))

    def table(self) -> dict[str, dict[str, float]]:
        """op -> {calls, payload, wire, elements}: plain dicts, as ranks return them to the notebook."""
        return {op: dataclasses.asdict(t) for op, t in self.ops.items()}
