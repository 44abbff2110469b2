"""Could the guard verify only what changed since its last check? Its module scan against fingerprints, one run.

    python benchmarks/guard_fingerprint.py [--repeats 5]

The guard's module scan (`scan_modules` in m11_helpers/grading/guard/kernel.py) reads every value of
every loaded module, before and after every check cell. A scan that skipped the modules unchanged since
the last call would pay instead for telling which changed: a fingerprint of each module, compared with
the one remembered. This times, in one kernel with a lesson's imports (benchmarks/guard_cost.py's), CPU
milliseconds of one call (median of `--repeats`) of:

- the scan as a guard call runs it (its per-call caches empty), with its caches already full, and with
  only its file cache full (keeping that one across calls would be sound; the class cache would not:
  a class's origin changes when the notebook patches it);
- a shallow fingerprint: the ids of each module dict's values (C loops only);
- a deeper one: also each value's type, each function's code object, and the ids in the dicts of the
  classes a module defines.

Neither fingerprint is enough to skip a module: both miss a patched method of a class whose
`__module__` names no module that holds it (the scan finds it through the instances), a class
reassigned under an instance (`obj.__class__ = ...`) and, unless the remembered state holds every value
alive, an id reused by a new object; a fingerprint that misses none visits every value's type, as the
scan does. The printed ratios are the most such a design could save.
"""

from __future__ import annotations

import argparse

from jupyter_client import KernelManager

from m11_helpers.grading.guard.driver import Guard

IMPORTS = ("import torch, torch.distributed as dist, accelerate, matplotlib.pyplot as plt\n"
           "from m11_helpers.launch import launch\n"
           "from m11_helpers.grading.checks import checking, expect_close, passed\n")

FINGERPRINTS = r'''
import sys as _sys, time as _time


def _shallow():
    return {name: (id(d), len(d), hash(tuple(map(id, d.values()))))
            for name, mod in list(_sys.modules.items()) if (d := getattr(mod, "__dict__", None)) is not None}


def _deep():
    function, out = type(_deep), {}
    for name, mod in list(_sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if d is None:
            continue
        values = list(d.values())
        parts = [id(d), len(d), hash(tuple(map(id, values))), hash(tuple(map(id, map(type, values))))]
        for v in values:
            if type(v) is function:
                parts.append(id(v.__code__))
            elif isinstance(v, type) and v.__dict__.get("__module__") == name:
                parts.append(hash(tuple(map(id, v.__dict__.values()))))
        out[name] = hash(tuple(parts))
    return out


def _ms(fn, n):
    times = []
    for _ in range(n):
        t = _time.process_time()
        fn()
        times.append(_time.process_time() - t)
    return round(sorted(times)[n // 2] * 1000, 1)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(60)
        guard = Guard(kc)
        guard.baseline()

        def run(code: str) -> str:
            out: list[str] = []
            reply = kc.execute_interactive(code, timeout=300, output_hook=lambda m: out.append(
                m["content"].get("text", "")))
            assert reply["content"]["status"] == "ok", reply["content"]
            return "".join(out)

        run(IMPORTS)
        run(FINGERPRINTS)
        # the guard's own kernel-side part, in a namespace of its own, as a guard call runs it
        run(f"_ns = {{'ARGS': {{'roots': {guard.roots!r}}}}}\nexec({guard.parts[0]!r}, _ns)")
        n = args.repeats
        cold = "lambda: (_ns['FOUND'].clear(), _ns['_files'].clear(), _ns['_types'].clear(), _ns['scan_modules']())"
        files = "lambda: (_ns['FOUND'].clear(), _ns['_types'].clear(), _ns['scan_modules']())"
        got = run(f"print(len(_sys.modules), _ms({cold}, {n}), _ms(lambda: (_ns['FOUND'].clear(), "
                  f"_ns['scan_modules']()), {n}), _ms(_shallow, {n}), _ms(_deep, {n}), _ms({files}, {n}))")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    modules, scan, warm, shallow, deep, files = got.strip().splitlines()[-1].split()
    print(f"kernel CPU per call, {modules} modules loaded (median of {n}):")
    print(f"  module scan, as a guard call runs it: {scan} ms")
    print(f"  module scan, its caches full:         {warm} ms")
    print(f"  module scan, its file cache full:     {files} ms   scan / that:    {float(scan) / float(files):.1f}x")
    print(f"  shallow fingerprint:                  {shallow} ms   scan / shallow: {float(scan) / float(shallow):.1f}x")
    print(f"  deeper fingerprint:                   {deep} ms   scan / deeper:  {float(scan) / float(deep):.1f}x")


if __name__ == "__main__":
    main()
