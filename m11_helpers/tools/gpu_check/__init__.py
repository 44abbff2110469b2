"""`m11 gpu-check`: run every GPU branch of the course on this machine and write a report, in one command.

    m11 gpu-check                  # on a machine with NVIDIA GPUs: all checks, report in build/gpu-check.md
    m11 gpu-check --list           # what it would run (works anywhere)
    m11 gpu-check --only matmul sdpa --out /tmp/report.md
    m11 gpu-check --only notebooks --budget 1500   # every course notebook under nbval, one line each
    m11 gpu-check --only grading --budget 1800     # every solution notebook through the grader: full marks

Without a GPU it says so and exits 0 having run nothing. Each check prints one line as it finishes
(passed / failed / skipped, and its measured figure); a failing check does not stop the others, and
the exit code is 1 when any failed. The whole run keeps to `--budget` seconds (default 480, the
8 minutes the instructor guide promises on one GPU): checks that would start after the budget is
spent are skipped with that reason. The checks are in `compute.py` (one device), `distributed.py` (through the
launchers) and `course_runs.py` (the course: `nbval-NN` and `grade-NN` per lesson, groups `notebooks` and
`grading`; all of them need more than the default budget, so split the run with `--only`).

Each check runs in a fresh interpreter of its own (multiprocessing "spawn"), killed with all it
started when what is left of the budget runs out. A check that computes on the GPU initialises CUDA
in its process, and a process that has done so can no longer fork ranks that use CUDA: in one
process, every `launch()` check after the first GPU computation failed. A crash of one check (a CUDA
fault, an abort in NCCL) is then a failed line, not the end of the run. This process itself never
initialises CUDA: the GPUs are counted and named through NVML (`m11_helpers.environment.gpu_names`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from m11_helpers.tools.gpu_check import compute as c
from m11_helpers.tools.gpu_check import course_runs
from m11_helpers.tools.gpu_check import distributed as d
from m11_helpers.tools.gpu_check.checks import Check, Skip

__all__ = ["CHECKS", "Result", "all_checks", "run_checks", "report_markdown", "main"]

# In the order they run: the cheap, fundamental ones first; the course's notebooks (course_runs), which
# use the rest of the budget, last.
CHECKS = [
    Check("nccl-launch", "launch() with NCCL, one rank per GPU, an all-reduce", d.check_nccl_launch),
    Check("matmul", "fp32 / tf32 / bf16 matmul TFLOP/s, fraction of lesson 01's datasheet peak", c.check_matmul),
    Check("train-step", "GPT-2-small training step, tokens/s and MFU, bf16 vs fp32", c.check_train_step),
    Check("sdpa", "SDPA backends available; flash vs naive attention memory at 8k tokens", c.check_sdpa),
    Check("fp16-scaler", "torch.amp fp16 + GradScaler('cuda'): an inf step is skipped, the scale halved", c.check_fp16_scaler),
    Check("fsdp2", "FSDP2 fully_shard with MixedPrecisionPolicy on GPU (1 rank)", d.check_fsdp2),
    Check("train-script", "the reference training script for a few steps with activation checkpointing", d.check_reference_script),
    Check("dcp", "torch.distributed.checkpoint save/load of GPU tensors", d.check_dcp),
]


def all_checks(repo: Path | None = None) -> list[Check]:
    """The machine's checks, then one nbval and one grading check per lesson of the repository."""
    return CHECKS + course_runs.course_checks(repo)


def _selected(check: Check, names: list[str] | None) -> bool:
    groups = [course_runs.GROUPS[n] for n in names or () if n in course_runs.GROUPS]
    return not names or check.name in names or any(check.name.startswith(g) for g in groups)


@dataclasses.dataclass
class Result:
    name: str
    status: str  # passed | failed | skipped
    figure: str
    seconds: float = 0.0


def run_checks(names: list[str] | None = None, budget_s: float = 480, repo: Path | None = None,
               echo: bool = True) -> list[Result]:
    """Run the named checks (all by default) in order, each in a process of its own (the module docstring says why)."""
    deadline = time.monotonic() + budget_s
    ctx = {"repo": repo, "deadline": deadline}  # CLOCK_MONOTONIC is one clock for every process of the machine
    results = []
    for check in all_checks(repo):
        if not _selected(check, names):
            continue
        start = time.monotonic()
        if start > deadline:
            res = Result(check.name, "skipped", f"the {budget_s:g} s budget was spent before it started")
        else:
            res = _run_isolated(check, ctx, deadline - start)
        res.seconds = round(time.monotonic() - start, 1)
        results.append(res)
        if echo:
            print(f"  {res.status:<8}{res.name:<14}{res.figure}", flush=True)
    return results


def _run_isolated(check: Check, ctx: dict, timeout: float) -> Result:
    """`check.run(ctx)` in a fresh spawned interpreter; its status and figure, or why it has none."""
    import multiprocessing

    from m11_helpers.procs import kill_tree

    spawn = multiprocessing.get_context("spawn")
    reader, writer = spawn.Pipe(duplex=False)
    proc = spawn.Process(target=_child, args=(check.run, ctx, writer, os.getpid()), name=f"gpu-check {check.name}")
    proc.start()
    writer.close()  # ours: EOF on the reader once the child is gone
    answered = False
    try:
        if not reader.poll(timeout):
            return Result(check.name, "failed", f"did not finish within the {timeout:.0f} s left of the budget: stopped")
        status, figure = reader.recv()
        answered = True
        return Result(check.name, status, figure)
    except EOFError:  # the child died without a word: a segfault, an abort in a CUDA library, OOM-killed
        proc.join(5)
        return Result(check.name, "failed", f"its process died (exit code {proc.exitcode}) before reporting")
    finally:
        reader.close()
        proc.join(10 if answered else 0)
        if proc.exitcode is None:  # still running (timed out, or stuck after answering): it and all it started
            kill_tree([proc.pid])  # not after a join reaped it: its pid may belong to someone else by then
            proc.join(1)


def _child(run, ctx: dict, writer, parent: int) -> None:
    """The check's own process: run it, send (status, figure) back."""
    from m11_helpers.procs import die_with_parent

    die_with_parent(parent=parent)  # a killed `m11 gpu-check` takes its check with it
    try:
        writer.send(("passed", run(ctx).figure))
    except Skip as why:
        writer.send(("skipped", str(why)))
    except Exception as err:  # noqa: BLE001 - a failing check is a result, the others still run
        writer.send(("failed", traceback.format_exception_only(type(err), err)[-1].strip()[:500]))
    finally:
        writer.close()


def report_markdown(results: list[Result], environment: str) -> str:
    """The report: one line per check (status, seconds, figure), then a one-line summary."""
    icon = {"passed": "✔", "failed": "✘", "skipped": "–"}
    lines = ["# m11 gpu-check", "", environment, "", "| check | status | seconds | measured |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.name} | {icon.get(r.status, '?')} {r.status} | {r.seconds:g} | "
                     f"{r.figure.replace('|', '/')} |")
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped")}
    lines += ["", f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped."]
    return "\n".join(lines) + "\n"


def _environment_line() -> str:
    """Versions and GPUs, read without initialising CUDA in this process (NVML names; torch.version)."""
    import torch

    from m11_helpers.environment import gpu_names

    gpus = gpu_names()
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) · Python {platform.python_version()} · "
            f"{len(gpus)}× {gpus[0] if gpus else 'no GPU'} · {time.strftime('%Y-%m-%d %H:%M')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="m11 gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the checks and exit")
    ap.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks (or groups: notebooks, grading)")
    ap.add_argument("--out", type=Path, default=Path("build") / "gpu-check.md", help="report path")
    ap.add_argument("--budget", type=float, default=480, help="seconds for the whole run (default 480)")
    args = ap.parse_args(argv)
    repo = _repo()
    checks = all_checks(repo)
    unknown = sorted(set(args.only or ()) - {c.name for c in checks} - set(course_runs.GROUPS))
    if unknown:
        ap.error(f"--only {' '.join(unknown)}: no such check (m11 gpu-check --list)")  # exits 2
    if args.list:
        for c in checks:
            print(f"  {c.name:<14}{c.what}")
        if repo is None:
            print("  (nbval-NN, grade-NN: one per lesson, listed inside the course repository)")
        print(f"  groups: {', '.join(course_runs.GROUPS)} (every nbval-NN / grade-NN)")
        return 0
    if args.budget <= 0:
        print("m11 gpu-check: --budget must be > 0 seconds", file=sys.stderr)
        return 2
    from m11_helpers.launch.base import gpu_count

    if gpu_count() == 0:
        print("m11 gpu-check: no CUDA GPU on this machine (torch.cuda.device_count() is 0): nothing to run.\n"
              "Run it on a machine with an NVIDIA GPU; `m11 gpu-check --list` shows what it checks.")
        return 0
    env = _environment_line()
    print(f"m11 gpu-check: {env}", flush=True)
    results = run_checks(args.only, args.budget, repo)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report_markdown(results, env), encoding="utf-8")
    print(f"report written to {args.out}")
    return 1 if any(r.status == "failed" for r in results) else 0


def _repo() -> Path | None:
    from m11_helpers.tools.paths import repo_root

    try:
        return repo_root()
    except ValueError:
        return None
