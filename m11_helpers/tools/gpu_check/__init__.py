"""`m11 gpu-check`: run every GPU branch of the course on this machine and write a report, in one command.

    m11 gpu-check                  # on a machine with NVIDIA GPUs: all checks, report in build/gpu-check.md
    m11 gpu-check --list           # what it would run (works anywhere)
    m11 gpu-check --only matmul sdpa --out /tmp/report.md

Without a GPU it says so and exits 0 having run nothing. Each check prints one line as it finishes
(passed / failed / skipped, and its measured figure); a failing check does not stop the others, and
the exit code is 1 when any failed. The whole run keeps to `--budget` seconds (default 480, the
8 minutes the instructor guide promises on one GPU): checks that would start after the budget is
spent are skipped with that reason. The checks are in `compute.py` (one device) and `distributed.py` (through the launchers).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
import traceback
from pathlib import Path

from m11_helpers.tools.gpu_check import compute as c
from m11_helpers.tools.gpu_check import distributed as d
from m11_helpers.tools.gpu_check.checks import Check, Outcome, Skip

__all__ = ["CHECKS", "Result", "run_checks", "report_markdown", "main"]

# In the order they run: the cheap, fundamental ones first; the notebooks, which use the rest of the
# budget, last.
CHECKS = [
    Check("nccl-launch", "launch() with NCCL, one rank per GPU, an all-reduce", d.check_nccl_launch),
    Check("matmul", "fp32 / tf32 / bf16 matmul TFLOP/s, fraction of lesson 01's datasheet peak", c.check_matmul),
    Check("train-step", "GPT-2-small training step, tokens/s and MFU, bf16 vs fp32", c.check_train_step),
    Check("sdpa", "SDPA backends available; flash vs naive attention memory at 8k tokens", c.check_sdpa),
    Check("fp16-scaler", "torch.amp fp16 + GradScaler('cuda'): an inf step is skipped, the scale halved", c.check_fp16_scaler),
    Check("fsdp2", "FSDP2 fully_shard with MixedPrecisionPolicy on GPU (1 rank)", d.check_fsdp2),
    Check("train-script", "the reference training script for a few steps with activation checkpointing", d.check_reference_script),
    Check("dcp", "torch.distributed.checkpoint save/load of GPU tensors", d.check_dcp),
    Check("notebooks", "every course notebook top to bottom under nbval-lax with the GPU visible", d.check_notebooks),
]


@dataclasses.dataclass
class Result:
    name: str
    status: str  # passed | failed | skipped
    figure: str
    seconds: float = 0.0


def run_checks(names: list[str] | None = None, budget_s: float = 480, repo: Path | None = None,
               echo: bool = True) -> list[Result]:
    """Run the named checks (all by default) in order, each isolated from the others' failures."""
    deadline = time.monotonic() + budget_s
    ctx = {"repo": repo, "deadline": deadline}
    results = []
    for check in CHECKS:
        if names and check.name not in names:
            continue
        start = time.monotonic()
        if start > deadline:
            res = Result(check.name, "skipped", f"the {budget_s:g} s budget was spent before it started")
        else:
            try:
                out: Outcome = check.run(ctx)
                res = Result(check.name, "passed", out.figure)
            except Skip as why:
                res = Result(check.name, "skipped", str(why))
            except Exception as err:  # noqa: BLE001 - a failing check is a result, the others still run
                last = traceback.format_exception_only(type(err), err)[-1].strip()
                res = Result(check.name, "failed", last[:500])
        res.seconds = round(time.monotonic() - start, 1)
        results.append(res)
        if echo:
            print(f"  {res.status:<8}{res.name:<14}{res.figure}", flush=True)
    return results


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
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) · Python {platform.python_version()} · "
            f"{len(gpus)}× {gpus[0] if gpus else 'no GPU'} · {time.strftime('%Y-%m-%d %H:%M')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="m11 gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the checks and exit")
    ap.add_argument("--only", nargs="+", metavar="CHECK", choices=[c.name for c in CHECKS],
                    help="run only these checks")
    ap.add_argument("--out", type=Path, default=Path("build") / "gpu-check.md", help="report path")
    ap.add_argument("--budget", type=float, default=480, help="seconds for the whole run (default 480)")
    args = ap.parse_args(argv)
    if args.list:
        for c in CHECKS:
            print(f"  {c.name:<14}{c.what}")
        return 0
    if args.budget <= 0:
        print("m11 gpu-check: --budget must be > 0 seconds", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("m11 gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False): nothing to run.\n"
              "Run it on a machine with an NVIDIA GPU; `m11 gpu-check --list` shows what it checks.")
        return 0
    from m11_helpers.tools.paths import repo_root

    try:
        repo = repo_root()
    except ValueError:
        repo = None
    env = _environment_line()
    print(f"m11 gpu-check: {env}", flush=True)
    results = run_checks(args.only, args.budget, repo)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report_markdown(results, env), encoding="utf-8")
    print(f"report written to {args.out}")
    return 1 if any(r.status == "failed" for r in results) else 0
