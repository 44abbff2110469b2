"""Lesson 10 — recovery without a restart: SIGKILL a replica mid-run, the others go on, a replacement rejoins live.

    drill = live_recovery_drill(replicas=3, steps=24, kill_at=6)   # real processes, real SIGKILL, real gloo
    drill["checksums"]        # {replica: sha256 of weights + AdamW state + step}: one value = bit-identical
    drill["losses"]           # {step: loss}, every step exactly once, against drill["reference_losses"]
    drill["recovery_s"], drill["join_stall_s"], drill["step_s"]

The caller plays torchft's Lighthouse (github.com/pytorch/torchft, `Lighthouse`/`Manager`): it forms
quorums. It forks a TCPStore process, `replicas` replica processes (m11_helpers.live_replica) and one
spare parked on a pipe. Replicas heart-beat into the store each step; a replica whose collective
fails asks for a new quorum. The lighthouse forms generation g+1 once every replica with a fresh
heartbeat (younger than `hb_timeout`) has asked — so a dead one is dropped when its heartbeat goes
stale — and names as source the member furthest ahead. When `kill_at` is reached the caller
SIGKILLs replica `kill_rid`; `rejoin_after` steps later it releases the spare, which asks to join;
the lighthouse raises the store's "join" flag, the trainers re-form after their current step and the
newcomer receives weights and optimizer state from a healthy peer. Nothing restarts; nothing is
left running (every process is killed and reaped on the way out, also on failure).
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import signal
import socket
import statistics
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from m11_helpers.live_replica import batch_indices, model_and_opt, run_replica, tokens, train_checksum
from m11_helpers.procs import die_with_parent, kill_tree
from m11_helpers.validate import non_negative_int, positive_int, positive_real

__all__ = ["live_recovery_drill", "reference_losses"]


def _child(port: int, rid: int, parent: int, body) -> None:
    """A forked process: one thread, dies with the caller; a failure goes to the store as error/{rid}."""
    die_with_parent(parent=parent)
    gc.freeze()  # inherited objects stay out of the collector's reach (docs/cpu-distributed-facts.md §4)
    torch.set_num_threads(1)  # before any compute: fork after OpenMP hangs with more threads
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 1
    try:
        body()
        code = 0
    except BaseException:  # noqa: BLE001 - the caller raises it, with the replica's id
        try:
            s = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5))
            s.set(f"error/{rid}", traceback.format_exc())
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
    finally:
        os._exit(code)


def _serve_store(listener: socket.socket, parent: int) -> None:
    """The drill's TCPStore in a process of its own, on the socket the caller bound (as the kit's launcher does)."""
    die_with_parent(parent=parent)  # first: a store outliving the caller would never be stopped
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _store = dist.TCPStore("127.0.0.1", listener.getsockname()[1], None, True, timedelta(hours=1),  # noqa: F841 - kept
                           wait_for_workers=False, master_listen_fd=listener.fileno())  # alive until killed
    while True:
        time.sleep(3600)


def _fork(fn) -> int:
    pid = os.fork()
    if pid == 0:
        fn()  # never returns: _child and _serve_store end the process
        os._exit(1)
    return pid


def reference_losses(steps: int, global_batch: int = 12, n: int = 192, seed: int = 0, lr: float = 1e-3) -> dict:
    """{step: loss} of the same training in one process on the whole global batch: what the drill must match."""
    model, opt = model_and_opt(seed, lr)
    x, y = tokens(n).tensors  # (n, T) each
    out = {}
    for step in range(steps):
        idx = batch_indices(step, global_batch, n)  # (global_batch,)
        opt.zero_grad(set_to_none=False)
        loss = model(x[idx], y[idx])
        loss.backward()
        opt.step()
        out[step] = loss.item()
    return out, train_checksum(model, opt, steps)


def _read(store, key: str):
    return json.loads(store.get(key)) if store.check([key]) else None


def live_recovery_drill(replicas: int = 3, steps: int = 24, kill_rid: int = 1, kill_at: int = 6,
                        rejoin_after: int = 4, global_batch: int = 12, n: int = 192, hb_timeout: float = 0.5,
                        pg_timeout: float = 10.0, timeout: float = 120.0, seed: int = 0, lr: float = 1e-3) -> dict:
    """Run the drill; returns checksums, losses, events, timings (see the module docstring). Raises on any failure."""
    if positive_int("replicas", replicas) < 2:
        raise ValueError(f"replicas must be >= 2 (one dies, one survives), got {replicas}")
    if not 0 <= non_negative_int("kill_rid", kill_rid) < replicas:
        raise ValueError(f"kill_rid must be in 0..{replicas - 1}, got {kill_rid}")
    positive_int("steps", steps)
    if positive_int("kill_at", kill_at) + positive_int("rejoin_after", rejoin_after) + 2 > steps:
        raise ValueError(f"steps must exceed kill_at + rejoin_after + 1 = {kill_at + rejoin_after + 1}, got {steps}")
    positive_real("hb_timeout", hb_timeout)
    cfg = {"steps": steps, "global_batch": global_batch, "n": n, "seed": seed, "lr": lr, "timeout": timeout,
           "pg_timeout": pg_timeout}
    parent, pids = os.getpid(), {}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    store_pid = _fork(lambda: _serve_store(listener, parent))
    listener.close()
    release_w = None
    try:
        for rid in range(replicas):
            pids[rid] = _fork(lambda rid=rid: _child(port, rid, parent, lambda: run_replica(rid, port, cfg)))
        spare = replicas
        release_r, release_w = os.pipe()
        pids[spare] = _fork(lambda: (os.close(release_w), _child(
            port, spare, parent, lambda: run_replica(spare, port, {**cfg, "joiner": True},
                                                     ready=lambda: os.read(release_r, 1)))))  # a hot spare
        os.close(release_r)
        out = _lighthouse(port, pids, replicas, kill_rid, kill_at, rejoin_after, hb_timeout, timeout, release_w)
        out["reference_losses"], out["reference_checksum"] = reference_losses(steps, global_batch, n, seed, lr)
        return out
    finally:
        if release_w is not None:
            os.close(release_w)
        kill_tree(list(pids.values()) + [store_pid])
        for pid in list(pids.values()) + [store_pid]:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _lighthouse(port, pids, replicas, kill_rid, kill_at, rejoin_after, hb_timeout, timeout, release_w) -> dict:
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout))
    spare, gen, quorums, t_kill, t_release, kill_step = replicas, -1, [], None, None, None
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"live-recovery drill: no end after {timeout} s; quorums {quorums}")
        for rid in pids:
            if store.check([f"error/{rid}"]):
                raise RuntimeError(f"replica {rid} failed:\n{store.get(f'error/{rid}').decode()}")
        finals = [r for r in pids if r != kill_rid]
        done = [r for r in finals if store.check([f"result/{r}"])]
        if len(done) == len(finals):
            break
        if spare not in done and len(done) == len(finals) - 1 and not any(spare in q["members"] for q in quorums):
            raise RuntimeError("the replacement did not join before the survivors finished: raise steps")
        now = time.time()
        hbs = {r: h for r in pids if (h := _read(store, f"hb/{r}")) is not None}
        asks = {r: a for r in pids if (a := _read(store, f"ask/{r}")) is not None}
        if t_kill is None and hbs.get(kill_rid, {}).get("step", -1) >= kill_at:
            os.kill(pids[kill_rid], signal.SIGKILL)  # no warning, no handler: a machine gone
            t_kill, kill_step = time.time(), hbs[kill_rid]["step"]
        survivors = [r for r in range(replicas) if r != kill_rid]
        if (t_kill is not None and t_release is None and gen >= 1
                and min(hbs[r]["step"] for r in survivors) >= kill_step + rejoin_after):
            os.write(release_w, b"x")  # the replacement starts now
            t_release = time.time()
        if asks:
            alive = {r for r, h in hbs.items() if now - h["t"] < hb_timeout}
            stateful = gen < 0 or max(a["step"] for a in asks.values()) > 0  # never a quorum of newcomers only
            if stateful and set(asks) >= (alive if gen >= 0 else set(range(replicas))):
                gen += 1
                members = sorted(asks)
                source = max(members, key=lambda r: (asks[r]["step"], -r))  # furthest ahead, lowest id
                store.set(f"quorum/{gen}", json.dumps({"gen": gen, "members": members, "source": source}))
                for r in asks:
                    store.delete_key(f"ask/{r}")
                store.set("gen", str(gen))
                store.delete_key("join")
                quorums.append({"gen": gen, "members": members, "source": source, "t": time.time()})
            elif not store.check(["join"]):
                store.set("join", "1")  # someone waits: the trainers re-form after this step
        time.sleep(0.005)
    results = {r: pickle.loads(bytes.fromhex(store.get(f"result/{r}").decode())) for r in finals}
    return _summary(results, quorums, t_kill, kill_step, t_release, spare, kill_rid)


def _summary(results, quorums, t_kill, kill_step, t_release, spare, kill_rid) -> dict:
    losses: dict[int, float] = {}
    for res in results.values():
        for s, v in res["losses"].items():
            if losses.setdefault(s, v) != v:
                raise AssertionError(f"replicas disagree on the loss of step {s}: {losses[s]} vs {v}")
    survivor = next(r for r in results if r != spare)
    commits = results[survivor]["commits"]  # [(time, step)]
    gaps = [b[0] - a[0] for a, b in zip(commits, commits[1:])]
    failed = [e for r in results.values() for e in r["events"] if e["what"] == "collective failed"]
    redone = next(t for t, s in commits if s == min(e["step"] for e in failed) + 1)  # the failed step, taken again
    join_q = next(q for q in quorums if spare in q["members"])
    joined = [e for e in results[spare]["events"] if e["what"] == "quorum"][0]
    source_view = next(e for e in results[join_q["source"]]["events"] if e["what"] == "quorum"
                       and e["gen"] == join_q["gen"])
    before = max(t for t, s in commits if t < join_q["t"])
    after = min(t for t, s in commits if t > join_q["t"])
    return {
        "checksums": {r: res["checksum"] for r, res in results.items()},
        "steps": {r: res["step"] for r, res in results.items()},
        "losses": dict(sorted(losses.items())),
        "quorums": quorums, "kill_step": kill_step, "killed": kill_rid,
        "failures_seen": failed, "detect_s": min(e["t"] for e in failed) - t_kill,
        "recovery_s": redone - t_kill, "step_s": statistics.median(gaps),
        "join_checksum": joined["checksum"], "source_checksum_at_join": source_view["checksum"],
        "join_step": joined["step"], "join_wait_s": joined["t"] - t_release, "join_stall_s": after - before,
    }
