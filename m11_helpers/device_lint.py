"""Device rules, read statically: code that gloo on CPU accepts and a GPU run gets wrong (the half that needs no run).

Four rules, over the package, the scripts, the benchmarks, every course and solution notebook's code
cells and the wrong-answer files (`python -m m11_helpers.device_lint` lists the findings;
tests/test_device_proof.py asserts there are none):

- factory-no-device: `torch.zeros(...)`, `torch.tensor(...)`... without `device=` in a function that
  runs a collective: NCCL rejects the CPU buffer (the dynamic twin: m11_helpers.device_check);
- rng-cpu-only: a capture/restore of `torch.get_rng_state()` alone, or `fork_rng(devices=[])`: the
  accelerator's generator (dropout masks on a GPU) is not restored (the kit's: m11_helpers.device_state.rng_state);
- timing-unsynced: wall-clock reads around tensor work with no synchronise: a GPU returns before its
  kernels finish (the kit's timer: m11_helpers.timing.time_it, or `timing.synchronize()`);
- memory-cpu-only: RSS or tracemalloc read where the lesson measures tensor bytes: the accelerator's
  allocator is not seen (the kit's: m11_helpers.device_state.allocated_bytes).

Opt out, with the reason, on the line, the one above, or a whole function on its `def` line (or the one
above it): `# m11: cpu-only - <why>`.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Iterator

from m11_helpers.device_check import COLLECTIVES

REPO = Path(__file__).resolve().parents[1]  # the checkout this package runs from
__all__ = ["Finding", "lint_source", "lint_paths", "course_files", "main"]

FACTORIES = {"empty", "zeros", "ones", "full", "tensor", "as_tensor", "arange", "linspace", "eye", "rand",
             "randn", "randint", "randperm", "empty_strided"}
_DIST_OWNERS = {"dist", "torch.distributed", "c10d", "distributed_c10d"}
_ACC_OPS = {"gather", "reduce", "gather_for_metrics", "pad_across_processes"}  # Accelerator methods
_CLOCKS = {"perf_counter", "time", "monotonic", "perf_counter_ns"}
_SYNCS = {"synchronize", "time_it", "sync", "barrier", "elapsed_time", "timed", "synchronized"}
_TENSOR_WORK = {"backward", "step", "forward", "matmul", "mm", "bmm"}
_WRAPPER = re.compile(r"(^|_)(all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|isend|irecv|send|recv)(_|$)")
DEVICE_EXPECT = "No backend type associated with device type cpu"  # what a device wrong answer must be told
_OPT_OUT = re.compile(r"#\s*m11:\s*cpu-only\s*[-—:]\s*\S")


@dataclasses.dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.what}"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _scope_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """Nodes of one function (or module) body, not of the functions defined inside it (their own scope)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _is_collective(call: ast.Call) -> bool:
    """A torch.distributed call, an Accelerator's gather/reduce, or a helper named for one (`recv_forward`)."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in COLLECTIVES or bool(_WRAPPER.search(f.id))
    if isinstance(f, ast.Attribute):
        owner = _dotted(f.value)
        if f.attr in COLLECTIVES and owner in _DIST_OWNERS or _WRAPPER.search(f.attr):
            return True
        return f.attr in _ACC_OPS and owner.split(".")[-1] in ("acc", "accelerator")
    return False


def _names(nodes: list[ast.AST]) -> set[str]:
    out = set()
    for n in nodes:
        if isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Name):
            out.add(n.id)
    return out


def _is_factory(f: ast.AST | None) -> bool:
    return isinstance(f, ast.Attribute) and f.attr in FACTORIES and _dotted(f.value) == "torch"


def _scope_findings(scope: ast.AST) -> Iterator[tuple[int, str, str]]:
    nodes = list(_scope_nodes(scope))
    calls = [n for n in nodes if isinstance(n, ast.Call)]
    names = _names(nodes)
    if any(_is_collective(c) for c in calls):
        moved = {id(c.func.value) for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr in ("to", "cuda")}
        for c in calls:
            if id(c) in moved:
                continue  # torch.randn(..., generator=g).to(device): drawn on the CPU generator, then moved
            # `(torch.zeros if traced else torch.empty)(n)` chooses its factory: each branch is one
            f = next((b for b in (c.func.body, c.func.orelse) if _is_factory(b)), None) \
                if isinstance(c.func, ast.IfExp) else c.func
            if _is_factory(f) and not any(k.arg == "device" for k in c.keywords):
                yield c.lineno, "factory-no-device", (
                    f"torch.{f.attr}() without device= in code that runs a collective: NCCL rejects a CPU "
                    f"buffer; make it from the data (x.new_{'empty' if f.attr == 'empty' else 'zeros'}(...), "
                    f"device=x.device)")
    for c in calls:
        d = _dotted(c.func)
        if d.endswith("fork_rng") and any(k.arg == "devices" and isinstance(k.value, (ast.List, ast.Tuple))
                                          and not k.value.elts for k in c.keywords):
            yield c.lineno, "rng-cpu-only", "fork_rng(devices=[]) leaves the accelerator's generator unforked"
        if d in ("torch.get_rng_state", "torch.random.get_rng_state", "torch.set_rng_state") \
                and not names & {"cuda", "accelerator"}:
            yield c.lineno, "rng-cpu-only", (
                f"{d}() alone: a GPU's dropout masks come from the accelerator's generator; use "
                "m11_helpers.device_state.rng_state()/set_rng_state()")
    clocks = [c for c in calls if _dotted(c.func).split(".")[-1] in _CLOCKS
              and _dotted(c.func) in {"time." + k for k in _CLOCKS} | _CLOCKS]
    if len(clocks) >= 2 and not names & _SYNCS and names & _TENSOR_WORK:
        yield min(c.lineno for c in clocks), "timing-unsynced", (
            "wall-clock timing of tensor work with no synchronise: a GPU returns before its kernels end; "
            "use m11_helpers.timing.time_it (or timing.synchronize() before each clock read)")
    if names & {"tracemalloc", "memory_info", "getrusage"} and names & _TENSOR_WORK and \
            not names & {"memory_allocated", "max_memory_allocated", "allocated_bytes", "peak_bytes"}:
        line = min(n.lineno for n in nodes if isinstance(n, (ast.Attribute, ast.Name))
                    and (getattr(n, "attr", None) or getattr(n, "id", None)) in {"tracemalloc", "memory_info",
                                                                               "getrusage"})
        yield line, "memory-cpu-only", ("CPU allocations read where tensor bytes are measured: a GPU's live in "
                                        "its allocator; use m11_helpers.device_state.allocated_bytes")


def lint_source(source: str, path: str = "<source>", line_offset: int = 0) -> list[Finding]:
    """Findings in one file's (or one notebook cell's) source; opted-out lines are skipped."""
    tree = ast.parse(source)
    lines = source.splitlines()
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                   ast.Lambda))]
    out = []
    for scope in scopes:
        top = lines[max(0, scope.lineno - 2): scope.lineno] if hasattr(scope, "lineno") else []
        for line, rule, what in _scope_findings(scope):
            near = lines[max(0, line - 2): line] + top  # the line, the one above, or the function's def line
            if not any(_OPT_OUT.search(t) for t in near):
                out.append(Finding(path, line + line_offset, rule, what))
    return sorted(set(out), key=lambda f: (f.path, f.line, f.rule))


def _cells(path: Path) -> Iterator[tuple[int, str]]:
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            yield i, "\n".join("pass" if t.lstrip().startswith(("%", "!")) else t for t in src.splitlines())


def lint_paths(paths: list[Path]) -> list[Finding]:
    out: list[Finding] = []
    for p in paths:
        rel = str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)
        if p.suffix == ".ipynb":
            for i, src in _cells(p):
                out += lint_source(src, f"{rel}[cell {i}]")
        elif p.parent.name == "wrong_answers":
            out += _lint_wrong_answers(p.read_text(), rel)
        else:
            out += lint_source(p.read_text(), rel)
    return out


def _lint_wrong_answers(text: str, rel: str) -> list[Finding]:
    """Each recorded answer alone; the ones recorded *for* a device mistake (expect: NCCL's error) are skipped."""
    out, starts = [], [m.start() for m in re.finditer(r"^# %% ", text, re.M)] + [len(text)]
    for a, b in zip(starts, starts[1:]):
        block = text[a:b]
        if DEVICE_EXPECT not in block.splitlines()[0]:
            out += lint_source(block, rel, line_offset=text.count("\n", 0, a))
    return out


def course_files(root: Path = REPO) -> list[Path]:
    """Where ranks' code lives: the package (scripts included), benchmarks, course and solution notebooks, wrong answers."""
    return sorted([*(root / "m11_helpers").rglob("*.py"), *(root / "benchmarks").glob("*.py"),
                   *(root / "course").glob("*.ipynb"),
                   *(root / "solutions").glob("*.ipynb"), *(root / "solutions" / "wrong_answers").glob("*.py")])


def main(argv: list[str] | None = None) -> int:
    paths = [Path(a).resolve() for a in (argv if argv is not None else sys.argv[1:])] or course_files()
    found = lint_paths(paths)
    for f in found:
        print(f)
    print(f"{len(found)} device finding(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
