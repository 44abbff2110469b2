"""First set-up of the course's virtual environment (`make lab`, `make test`, the dev container), with progress.

    python3 m11_helpers/tools/setup_venv.py --venv .venv --extras lab,dev [--torch-spec torch==2.13.0]
                                            [--torch-index URL] [--torch-build auto|cpu|cuda] [--dry-run]

It runs before the course is installed: standard library only, run as a file. Each step prints its
number and the seconds so far; pip's or uv's own lines (Collecting…, Downloading…) show the rest.

- uv when it is on PATH (`uv venv`, `uv pip install`: parallel downloads), else the venv's own pip (the
  one `python -m venv` seeds: 23.x on Python 3.10+, new enough; upgrading it first cost a process and
  a download on every set-up);
- torch and the course in one resolver pass, the torch build chosen by the machine (`--torch-build auto`):
  an NVIDIA GPU (`nvidia-smi` on PATH, or /proc/driver/nvidia) takes PyPI's torch, the CUDA build; no
  NVIDIA GPU takes the CPU build — a CPU wheel of the version asked for that lies in pip's find-links (a
  machine's wheel store: this project's CI machines) as it is, else torch alone from PyTorch's CPU index
  (https://download.pytorch.org/whl/cpu), then the course. PyPI's Linux torch is the CUDA build, with
  several GB of nvidia-* wheels a laptop without an NVIDIA GPU cannot use;
- `--torch-index URL` (Makefile TORCH_INDEX) still takes torch alone from that index, then the course,
  and `--torch-spec` (TORCH_SPEC) names the torch; a torch already installed that satisfies it stays.

No lesson: the course's set-up (README "Quick start", docs/instructor-guide.md "Set-up in one line").
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_START = time.monotonic()


def nvidia_gpu() -> str | None:
    """Why this machine has an NVIDIA GPU (its driver), or None."""
    if shutil.which("nvidia-smi"):
        return "nvidia-smi is on PATH"
    if Path("/proc/driver/nvidia").exists():
        return "/proc/driver/nvidia exists"
    return None


def find_links() -> list[str]:
    """pip's find-links folders: $PIP_FIND_LINKS and pip's configuration (`pip config list`)."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        conf = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        conf = ""
    for value in re.findall(r"find-links='([^']*)'", conf):
        found += value.split()
    return list(dict.fromkeys(f.removeprefix("file://") for f in found))


def local_cpu_wheel(spec: str, folders: list[str]) -> Path | None:
    """A CPU torch wheel (`+cpu`) for this Python of the exact version `spec` pins (torch==X), in folders."""
    pinned = re.fullmatch(r"torch==([\w.]+)", spec.replace(" ", ""))
    if not pinned:
        return None
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in folders:
        for wheel in sorted(Path(folder).glob(f"torch-{pinned.group(1)}+cpu-{tag}-{tag}-*.whl")):
            return wheel
    return None


@dataclass
class Plan:
    """What set-up runs: each step's title and command (argv lists)."""
    tool: str
    torch_why: str
    steps: list[tuple[str, list[str]]] = field(default_factory=list)


def plan(venv: Path, extras: str, spec: str, index: str, build: str, uv: str | None,
         gpu: str | None, wheel: Path | None) -> Plan:
    """The set-up's steps for this machine (gpu: nvidia_gpu(); wheel: local_cpu_wheel(); uv: its path or None)."""
    if build not in ("auto", "cpu", "cuda"):
        raise ValueError(f"torch_build={build!r}: expected one of auto, cpu, cuda")
    py = str(venv / "bin" / "python")
    course = ["-e", f".[{extras}]" if extras else "."]
    pip = [uv, "pip", "install", "--python", py] if uv else [py, "-m", "pip", "install"]
    out = Plan("uv" if uv else "pip", "")
    if not (venv / "bin" / "python").exists():
        out.steps.append((f"create {venv}", [uv, "venv", "--seed", str(venv)] if uv else
                          [sys.executable, "-m", "venv", str(venv)]))
    cpu = build == "cpu" or (build == "auto" and not gpu)
    if index:
        out.torch_why = f"torch from {index} (TORCH_INDEX), then the course"
        out.steps += [("torch alone, from TORCH_INDEX", [*pip, "--index-url", index, spec]), ("the course", [*pip, *course])]
    elif not cpu:
        out.torch_why = f"PyPI's torch, the CUDA build ({gpu or 'asked for'})"
        out.steps.append(("torch and the course, one resolver pass", [*pip, spec, *course]))
    elif wheel:
        out.torch_why = f"the CPU build ({'asked for' if build == 'cpu' else 'no NVIDIA GPU'}): {wheel} from pip's find-links"
        out.steps.append(("torch and the course, one resolver pass", [*pip, str(wheel), *course]))
    else:
        out.torch_why = f"the CPU build ({'asked for' if build == 'cpu' else 'no NVIDIA GPU: no nvidia-smi, no /proc/driver/nvidia'}) from {CPU_INDEX}"
        out.steps += [("torch alone, the CPU build", [*pip, "--index-url", CPU_INDEX, spec]), ("the course", [*pip, *course])]
    return out


def say(text: str) -> None:
    print(f"[m11 set-up · {time.monotonic() - _START:5.0f} s] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(".venv"))
    parser.add_argument("--extras", default="lab,dev", help="the course's extras to install (comma-separated)")
    parser.add_argument("--torch-spec", default="torch==2.13.0")
    parser.add_argument("--torch-index", default="", help="take torch alone from this index (TORCH_INDEX)")
    parser.add_argument("--torch-build", default="auto", help="auto (by the machine's GPU), cpu or cuda")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    uv = None if os.environ.get("M11_NO_UV") else shutil.which("uv")
    gpu = nvidia_gpu()
    wheel = local_cpu_wheel(args.torch_spec, find_links()) if not args.torch_index else None
    try:
        steps = plan(args.venv, args.extras, args.torch_spec, args.torch_index, args.torch_build, uv, gpu, wheel)
    except ValueError as e:
        print(f"setup_venv: {e}", file=sys.stderr)
        return 2
    say(f"installing with {steps.tool}; torch: {steps.torch_why}")
    for i, (title, cmd) in enumerate(steps.steps, 1):
        say(f"{i}/{len(steps.steps)} {title}: {shlex.join(cmd)}")
        if args.dry_run:
            continue
        code = subprocess.run(cmd).returncode
        if code != 0:
            say(f"{i}/{len(steps.steps)} {title} failed (exit {code})")
            return code
    say("done" + (" (dry run)" if args.dry_run else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
