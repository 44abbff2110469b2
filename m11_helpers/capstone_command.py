"""The capstone's command line: read as `accelerate launch` reads it, then run as a cluster runs it.

    cmd = read_command(argv)     # accelerate's own parser + the config file it names: processes, launcher, script flags
    cmd.processes, cmd.one_process_why, cmd.script, cmd.flags     # 4, "" (or why it starts ONE), "capstone.py", [...]
    freeze({"build": build_run, ...}, path)   # a notebook's functions into a file the ranks can load
    run = run_command(argv)      # launch_script with the caller's own launcher flags: real processes, report()s back
    run_command(argv, reference=["--steps", 1]).results[r]["reference_losses"]   # + the script's own, same ranks

`accelerate launch` takes its settings from its flags and from the config file `--config_file`
names (a flag wins over the file); what it starts follows from them: `--cpu` (or `use_cpu: true`)
starts ONE process whatever `--num_processes` says (docs/cpu-distributed-facts.md §3), a
multi-process launcher needs `--multi_gpu` (or `distributed_type: MULTI_GPU`; on a CPU box the
environment's ACCELERATE_USE_CPU=1 makes its ranks gloo ranks). `read_command` applies exactly that
to what accelerate's parser returns, so a check can refuse a command before it spends a launch.
`freeze` pickles functions defined in `__main__` (a notebook) by value: their code (marshal, the
same interpreter runs the ranks), the globals they name (modules by name, everything else pickled
as usual) and their defaults; `scripts/capstone.py` thaws them in every rank. Lesson 11.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import marshal
import pickle
import shlex
import sys
import types
from pathlib import Path

__all__ = ["Command", "read_command", "capstone_flags", "freeze", "thaw", "run_command", "REFERENCE_ENV"]

REFERENCE_ENV = "M11_CAPSTONE_REFERENCE"  # scripts/capstone.py: flags for the script's own pieces, trained first


@dataclasses.dataclass
class Command:
    processes: int  # what accelerate would start on one node
    one_process_why: str  # non-empty: why this command starts ONE process whatever it asks for
    launcher: list[str]  # accelerate launch's own flags, as written
    script: str  # the training script's file name
    flags: list[str]  # the script's own arguments
    mixed_precision: str  # accelerate's (an autocast of its own around the script's)
    config: dict  # the config file's settings that matter here


def _config(path: str | None) -> dict:
    if not path:
        return {}
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(path)  # accelerate's own reader: YAML or JSON, defaults filled in
    return {"num_processes": cfg.num_processes, "distributed_type": str(cfg.distributed_type),
            "use_cpu": bool(cfg.use_cpu), "mixed_precision": str(cfg.mixed_precision), "num_machines": cfg.num_machines}


def read_command(argv: list) -> Command:
    """`argv` ("accelerate", "launch", flags..., script, args...) as accelerate reads it; ValueError if it cannot."""
    from accelerate.commands.launch import launch_command_parser

    argv = [str(a) for a in argv]
    if argv[:2] != ["accelerate", "launch"]:
        raise ValueError(f"argv must start with 'accelerate', 'launch', got {shlex.join(argv[:2])!r}")
    out = io.StringIO()
    try:  # argparse prints its complaint and exits: keep the text, raise it
        stderr, sys.stderr = sys.stderr, out
        args = launch_command_parser().parse_args(argv[2:])
    except SystemExit:
        raise ValueError(f"accelerate launch refuses it: {out.getvalue().strip().splitlines()[-1]}") from None
    finally:
        sys.stderr = stderr
    cfg = _config(args.config_file)
    processes = args.num_processes if args.num_processes is not None else cfg.get("num_processes", 1)
    multi = args.multi_gpu or cfg.get("distributed_type", "").endswith("MULTI_GPU")
    cpu = args.cpu or cfg.get("use_cpu", False)
    why = ("--cpu / use_cpu: true runs the script in ONE process (or mpirun with a hostfile)" if cpu else
           "" if multi or processes == 1 else "no multi-process launcher: --multi_gpu / distributed_type: MULTI_GPU")
    mixed = args.mixed_precision or cfg.get("mixed_precision", "no")
    n_launch = len(argv) - 2 - 1 - len(args.training_script_args)  # launcher flags end where the script begins
    return Command(processes if not why else 1, why, argv[2:2 + n_launch], Path(args.training_script).name,
                   list(args.training_script_args), str(mixed).split(".")[-1].lower(), cfg)


def capstone_flags(flags: list) -> tuple[str | None, object, list[str]]:
    """`scripts/capstone.py`'s arguments: (--run's file, the reference script's flags parsed by its own parser, those
    flags without --ckpt-dir); ValueError naming the flag the script refuses."""
    import argparse

    from m11_helpers.reference_run import script_module

    flags = [str(f) for f in flags]
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    p.add_argument("--run")
    ours, rest = p.parse_known_args(flags)
    out = io.StringIO()
    try:
        stderr, sys.stderr = sys.stderr, out
        args = script_module().parse(rest)
    except SystemExit:
        raise ValueError(f"the script refuses its flags: {out.getvalue().strip().splitlines()[-1]}") from None
    finally:
        sys.stderr = stderr
    keep = [f for i, f in enumerate(rest) if f != "--ckpt-dir" and (i == 0 or rest[i - 1] != "--ckpt-dir")]
    return ours.run, args, keep


# -- functions across processes ------------------------------------------------------------------
def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions, lambdas, comprehensions
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _thaw_function(code: bytes, name: str, scope: dict, defaults, kwdefaults, closure):
    g = {"__builtins__": __builtins__, "__name__": "__main__", **scope}
    cells = tuple(types.CellType(v) for v in closure) if closure is not None else None
    fn = types.FunctionType(marshal.loads(code), g, name, defaults, cells)
    fn.__kwdefaults__ = kwdefaults
    g.setdefault(name, fn)  # a function that names itself (recursion) finds itself
    return fn


class _Freezer(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        if isinstance(obj, types.FunctionType) and obj.__module__ == "__main__":
            scope = {n: obj.__globals__[n] for n in sorted(_names(obj.__code__))
                     if n in obj.__globals__ and obj.__globals__[n] is not obj}
            closure = None if obj.__closure__ is None else tuple(c.cell_contents for c in obj.__closure__)
            return _thaw_function, (marshal.dumps(obj.__code__), obj.__name__, scope, obj.__defaults__,
                                    obj.__kwdefaults__, closure)
        return NotImplemented


def freeze(payload: dict, path: str | Path) -> Path:
    """Write `payload` (functions from a notebook among its values) to `path` for `thaw` in another process."""
    with open(path, "wb") as f:
        _Freezer(f, protocol=pickle.HIGHEST_PROTOCOL).dump(payload)
    return Path(path)


def thaw(path: str | Path) -> dict:
    """What `freeze` wrote (call it in a process of the same interpreter and packages)."""
    with open(path, "rb") as f:
        return pickle.load(f)


def run_command(argv: list, timeout: float = 150.0, reference: list | None = None, **kwargs):
    """Run `argv` for real: its own launcher flags and script arguments under `launch_script` (CPU ranks here).
    `reference`: flags appended to the run's, with which every process of scripts/capstone.py first trains the
    script's own pieces and reports their losses (`reference_losses`): a check's reference on the same ranks."""
    from m11_helpers.launch import launch_script
    from m11_helpers.resources import script_path

    if reference is not None:
        kwargs["env"] = {**kwargs.get("env", {}), REFERENCE_ENV: shlex.join(str(f) for f in reference)}
    cmd = read_command(argv)
    if cmd.one_process_why:
        raise ValueError(f"argv starts ONE process: {cmd.one_process_why}")
    script = next(a for a in reversed(argv[:len(argv) - len(cmd.flags)]) if Path(str(a)).name == cmd.script)
    path = Path(str(script)) if Path(str(script)).is_file() else script_path(cmd.script)
    return launch_script(path, *cmd.flags, num_processes=cmd.processes, device="cpu", timeout=timeout,
                         launcher_flags=cmd.launcher, **kwargs)
