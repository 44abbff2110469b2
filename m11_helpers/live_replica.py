"""Lesson 10 — one data-parallel replica that survives its peers: quorum, re-formed gloo group, state from a healthy peer.

    run_replica(rid, port, cfg)      # the body of one forked replica process (live_recovery.py forks them)

Every replica trains the tiny GPT on its share of one fixed global batch per step, so the loss
curve is the single-process one whatever the membership. Each step it all-reduces one flat vector
(gradients, the summed loss, a "someone is waiting to join" flag), gathered and summed in member
order in the gloo group of its current generation. When that collective fails — a peer was SIGKILLed: gloo reports "Connection closed by
peer" within a fraction of a second — the step is not taken; the replica asks the lighthouse for a
new quorum and waits (heart-beating) until it is in one. A new quorum is a new gloo group on a fresh
store prefix (`g{gen}/`); its first act is to broadcast parameters, AdamW state and the step counter
from the member the lighthouse named (the one furthest ahead), so a fresh replica and the survivors
leave it bit-identical. The protocol is torchft's (github.com/pytorch/torchft: Lighthouse, Manager,
ProcessGroupGloo reconfigured per quorum, state from a healthy peer) reduced to its core; ours.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from m11_helpers.data import tokens
from m11_helpers.fault_tolerance import batch_indices
from m11_helpers.models import tiny_gpt

__all__ = ["train_checksum", "flat_state", "load_flat_state", "run_replica", "model_and_opt"]


def model_and_opt(seed: int, lr: float):
    """The replica's tiny GPT and its AdamW, state made eagerly, from `seed`: the same on every replica."""
    model = tiny_gpt(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for p in model.parameters():  # AdamW creates its state lazily; a joiner needs the same tensors to receive into
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    return model, opt


def _state_tensors(model, opt) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        s = opt.state[p]
        out += [p.data, s["exp_avg"], s["exp_avg_sq"], s["step"].view(1)]
    return out


def flat_state(model, opt, step: int) -> torch.Tensor:
    """(n,) fp32: parameters, AdamW moments and step counts, then the training step — all a replica is."""
    return torch.cat([t.reshape(-1) for t in _state_tensors(model, opt)] + [torch.tensor([float(step)])])


def load_flat_state(model, opt, flat: torch.Tensor) -> int:
    """Copy a flat_state vector back, bit for bit; returns the training step it carried."""
    i = 0
    for t in _state_tensors(model, opt):
        t.copy_(flat[i:i + t.numel()].view_as(t))
        i += t.numel()
    return int(flat[i])


def train_checksum(model, opt, step: int) -> str:
    """sha256 of flat_state's bytes: equal iff weights, optimizer state and step are bitwise equal."""
    return hashlib.sha256(flat_state(model, opt, step).numpy().tobytes()).hexdigest()[:16]


def _wait_quorum(store, rid: int, gen: int, step: int, hb) -> dict:
    """Ask for a quorum after `gen`; heart-beat until the lighthouse publishes one that includes us."""
    store.set(f"ask/{rid}", json.dumps({"gen": gen, "step": step}))
    g = gen + 1
    while True:
        key = f"quorum/{g}"
        if store.check([key]):
            q = json.loads(store.get(key))
            if rid in q["members"]:
                return q
            g += 1  # formed without us (we were slow to ask): the next one will have us
            continue
        hb(step)
        time.sleep(0.01)


def run_replica(rid: int, port: int, cfg: dict, ready=None) -> None:
    """Train cfg["steps"] steps as replica `rid`; write the result to the store under result/{rid}.

    ready: called once the model and data are built, before the first quorum (a hot spare waits in it).
    """
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=cfg["timeout"]))
    model, opt = model_and_opt(cfg["seed"], cfg["lr"])
    x_all, y_all = tokens(cfg["n"]).tensors  # (n, T) each
    events, losses, commits = [], {}, []
    if ready is not None:
        ready()
        events.append({"t": time.time(), "what": "started"})  # m11: cpu-only - an event's wall time, no kernel timed

    def hb(step):
        store.set(f"hb/{rid}", json.dumps({"step": step, "t": time.time()}))

    step, gen, pg, members = 0, int(store.get("gen")) if cfg.get("joiner") else -1, None, []
    need_quorum = True
    while step < cfg["steps"]:
        if need_quorum:
            q = _wait_quorum(store, rid, gen, step, hb)
            gen, members = q["gen"], q["members"]
            pg = dist.ProcessGroupGloo(dist.PrefixStore(f"g{gen}/", store), members.index(rid), len(members),
                                       timedelta(seconds=cfg["pg_timeout"]))
            flat = flat_state(model, opt, step)  # (n,)
            pg.broadcast(flat, members.index(q["source"])).wait()  # the healthy peer's state, to everyone
            step = load_flat_state(model, opt, flat)
            events.append({"t": time.time(), "what": "quorum", "gen": gen, "members": members,
                           "source": q["source"], "step": step, "checksum": train_checksum(model, opt, step)})
            need_quorum = False
        hb(step)
        idx = batch_indices(step, cfg["global_batch"], cfg["n"])  # (global_batch,)
        mine = idx.chunk(len(members))[members.index(rid)]  # this replica's share of the fixed global batch
        opt.zero_grad(set_to_none=False)
        loss = model(x_all[mine], y_all[mine])
        loss.backward()
        join = float(store.check(["join"]))  # a replica is waiting: everyone re-forms after this step
        w = len(mine) / cfg["global_batch"]  # shares may differ by one row: weight each by its size
        vec = torch.cat([p.grad.reshape(-1) * w for p in model.parameters()]
                        + [loss.new_tensor([loss.item() * w, join])])  # (P + 2,): Σ over replicas = global mean
        parts = [torch.empty_like(vec) for _ in members]
        try:
            # all-gather and sum in member order, not all-reduce: gloo's all-reduce at 3 ranks can leave the
            # ranks' sums a rounding apart (measured), and then their weights drift apart bit by bit
            pg.allgather([parts], [vec]).wait()
        except RuntimeError as exc:  # a peer died: do not step, ask for a new quorum
            events.append({"t": time.time(), "what": "collective failed", "gen": gen, "step": step,
                           "error": str(exc).splitlines()[0][:200]})
            need_quorum = True
            continue
        vec = torch.stack(parts).sum(dim=0)  # (P + 2,): the same bits on every replica
        i = 0
        for p in model.parameters():
            p.grad.copy_(vec[i:i + p.numel()].view_as(p))  # the global batch's mean gradient
            i += p.numel()
        opt.step()
        losses[step] = float(vec[-2])
        step += 1
        commits.append((time.time(), step))
        if vec[-1] > 0:
            need_quorum = True
    store.set(f"result/{rid}", pickle.dumps({"rid": rid, "losses": losses, "commits": commits, "events": events,
                                             "checksum": train_checksum(model, opt, step), "step": step}).hex())
