"""The caller's side of `launch()`: watch every rank's pipes until all reported, one failed, or the timeout.

`fork.py` starts the ranks; this module reads what they send (results, tracebacks, printed output),
releases them, and makes sure no process of the launch is left: each rank leads a process group of
its own, so what a rank started (a `subprocess.Popen`) is found and killed even after the rank
exited; each rank is also the subreaper of what it starts and kills it all on its way out, which
reaches a child that left the group (`setsid`). The output pipes are read until EOF or a short
deadline, never longer: a pipe held elsewhere (the setsid child of a rank that was killed before it
could clean up) cannot hold `launch()` past its timeout.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import time
from typing import Any

from m11_helpers.launch.base import LaunchError, LaunchPlan, LaunchTimeout, exit_reason
from m11_helpers.procs import kill_groups

DRAIN_S = 1.0  # after the ranks' groups are killed, EOF is immediate; this bounds a pipe held elsewhere
# Share of one core a rank may use and still count as waiting: a gloo rank blocked in a send uses ~0.005
# (its library threads wake now and then); a rank that computes gets 0.12 even with 16 runnable
# processes on 2 cores.
IDLE_SHARE = 0.03


def _is_consequence(message: str) -> bool:
    """A peer's error that only says another rank went away (gloo's wording), not a cause."""
    return any(s in message for s in ("Connection reset by peer", "Connection closed by peer", "Broken pipe"))


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time the living `pids` have used so far (user + system, every thread)."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def collect(p: LaunchPlan, pids: list[int], pipes, timeout: float, show_output: bool,
            stall_timeout: float | None = None) -> list[Any]:
    """Read results and output until every rank reported, one failed, the timeout passed, or (with
    `stall_timeout`) the ranks still running sat idle for that long: all of them wait on each other."""
    n = p.num_processes
    res_fds = {pipes[r][0][0]: r for r in range(n)}
    out_fds = {pipes[r][1][0]: r for r in range(n)}
    buffers = {r: bytearray() for r in range(n)}  # partial result messages
    output = {r: bytearray() for r in range(n)}
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    start = time.monotonic()
    deadline = start + timeout
    open_fds = set(res_fds) | set(out_fds)
    stalled = False
    watched: tuple[int, ...] = ()  # the ranks still running, whose CPU `samples` sums
    samples: list[tuple[float, float]] = []  # (when, their CPU seconds), the oldest at least `stall_timeout` old

    def reported(r: int) -> bool:
        return r in results or r in failures

    while open_fds and not all(reported(r) for r in range(n)):
        wait = deadline - time.monotonic()
        if wait <= 0:
            break
        ready, _, _ = select.select(list(open_fds), [], [], min(wait, 0.5))
        for fd in ready:
            chunk = os.read(fd, 1 << 20)  # a result of many MB arrives in few reads
            if fd in out_fds:
                if chunk:
                    output[out_fds[fd]] += chunk
                else:
                    open_fds.discard(fd)
                continue
            r = res_fds[fd]
            if not chunk:  # EOF: the rank is gone
                open_fds.discard(fd)
                if not reported(r):
                    failures[r] = f"died ({exit_reason(pids[r])}) before returning"
                continue
            buffers[r] += chunk
            while len(buffers[r]) >= 8:
                (size,) = struct.unpack("!Q", buffers[r][:8])
                if len(buffers[r]) < 8 + size:
                    break
                msg = bytes(buffers[r][8:8 + size])
                del buffers[r][:8 + size]
                if msg[:1] == b"o":
                    results[r] = pickle.loads(msg[1:])
                else:
                    failures[r] = msg[1:].decode(errors="replace")
        if failures and deadline > time.monotonic() + 1.0:
            # The first failure usually takes its peers down within ~0.1 s: give them a moment to
            # report why, so the error shows the whole picture, then stop everyone.
            deadline = time.monotonic() + 1.0
        if stall_timeout is not None and not failures:
            # A deadlock costs (almost) no CPU: every rank sleeps in a send or receive nobody will match.
            # Anything that computes, even starved on a loaded machine, gets far more than IDLE_SHARE.
            # A rank whose result has begun to arrive is writing it (blocked on a full pipe while we read), not stalled.
            pending = tuple(r for r in range(n) if not reported(r) and not buffers[r])
            if not pending:
                continue
            now, cpu = time.monotonic(), _cpu_seconds([pids[r] for r in pending])
            if pending != watched:  # a rank reported: its CPU leaves the sum, so start over
                watched, samples = pending, []
            samples.append((now, cpu))
            while len(samples) > 1 and samples[1][0] <= now - stall_timeout:
                samples.pop(0)
            then, cpu_then = samples[0]
            if now - then >= stall_timeout and cpu - cpu_then < IDLE_SHARE * len(pending) * (now - then):
                stalled = True
                break

    if len(results) == n:
        for (_, _), (_, _), (_, rel_w) in pipes:
            with contextlib.suppress(OSError):
                os.write(rel_w, b"x")
        _wait_exit(pids, 10.0)
        # What a rank started and left running holds the rank's output pipe open (inherited stdout):
        # kill it (its process group outlives the rank), then drain what the ranks printed while
        # tearing down, until EOF or DRAIN_S.
        kill_groups(pids)
        _drain([fd for fd in open_fds if fd in out_fds], out_fds, output, time.monotonic() + DRAIN_S)
    text = _format_output(output)
    if show_output and text:
        print(text, end="" if text.endswith("\n") else "\n", flush=True)
    if len(results) == n:
        return [results[r] for r in range(n)]
    if failures:
        causes = [r for r in sorted(failures) if not _is_consequence(failures[r])] or sorted(failures)
        body = "\n".join(_prefix(failures[r], r) for r in causes)
        peers = [r for r in sorted(failures) if r not in causes]
        if peers:
            body += "\n" + "".join(f"[rank {r}] {failures[r].strip().splitlines()[-1][:160]}\n" for r in peers)
            body += "(the ranks above lost their connection to the failed rank: a consequence, not a cause)"
        stopped = [r for r in range(n) if not reported(r)]
        tail = f"\n(ranks {', '.join(map(str, stopped))} were still running and were stopped)" if stopped else ""
        who = "rank" if len(causes) == 1 else "ranks"
        # The headline carries the exception itself, so a one-line summary (a grader's table) says why.
        why = failures[causes[0]].strip().splitlines()[-1][:200]
        raise LaunchError(f"{who} {', '.join(map(str, causes))} of {n} failed: {why}\n{body}{tail}", failures, text)
    pending = [r for r in range(n) if not reported(r)]
    stacks = _stacks_of(pending, pids, pipes, out_fds, output)
    if stalled:
        raise LaunchTimeout(
            f"ranks {', '.join(map(str, pending))} of {n} sat idle (under {IDLE_SHARE:.0%} of a core each) for "
            f"stall_timeout={stall_timeout:g} s, each waiting on another (a deadlock); all ranks were stopped.{stacks}",
            {r: "stalled" for r in pending}, text,
        )
    raise LaunchTimeout(
        f"ranks {', '.join(map(str, pending))} of {n} did not finish within timeout={timeout:g} s "
        "(a collective some rank never joined, or a hang); all ranks were stopped. "
        f"Pass a larger timeout= if the work is just slow.{stacks}",
        {r: "timed out" for r in pending}, text,
    )


def _stacks_of(pending: list[int], pids: list[int], pipes, out_fds: dict[int, int], output) -> str:
    """Ask each stuck rank where it is (faulthandler on SIGUSR1) and return the innermost frames."""
    before = {r: len(output[r]) for r in pending}
    for r in pending:
        with contextlib.suppress(OSError):
            os.kill(pids[r], signal.SIGUSR1)
    _drain([pipes[r][1][0] for r in pending], out_fds, output, time.monotonic() + 0.5)
    lines = []
    for r in pending:
        dump = output[r][before[r]:].decode(errors="replace")
        frames = [ln.strip() for ln in dump.splitlines() if ln.strip().startswith("File ")]
        del output[r][before[r]:]  # keep the dump out of the learner's output
        if frames:
            lines.append(f"\n  rank {r} was at {frames[0]}")  # faulthandler lists the innermost frame first
    return "".join(lines)


def _drain(fds: list[int], out_fds: dict[int, int], output, deadline: float) -> None:
    """Append what `fds` (rank output pipes) hold to `output` until each is at EOF, or `deadline`."""
    fds = list(fds)
    while fds and (wait := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select(fds, [], [], min(wait, 0.1))
        for fd in ready:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            if chunk:
                output[out_fds[fd]] += chunk
            else:
                fds.remove(fd)


def _wait_exit(pids: list[int], limit: float) -> None:
    end = time.monotonic() + limit
    alive = set(pids)
    while alive and time.monotonic() < end:
        for pid in list(alive):
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    alive.discard(pid)
        if alive:
            time.sleep(0.005)


def _prefix(text: str, rank: int) -> str:
    return "".join(f"[rank {rank}] {line}\n" for line in text.rstrip("\n").splitlines())


def _format_output(output: dict[int, bytearray]) -> str:
    return "".join(_prefix(buf.decode(errors="replace"), r) for r, buf in sorted(output.items()) if buf.strip())
