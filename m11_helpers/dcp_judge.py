"""Lesson 10 — exercise 10.7's verdicts: what the drill's evidence (m11_helpers.dcp_drill) says about a checkpointer.

    save_problems(outs, folder, SAVE_AT)        # [(what was wrong, hint)] from the ranks' file operations
    checkpoint_problems(step_dir(folder, 4), 2) # what the published folder lacks (optimizer state, even shards)
    kill_expectation(outs[0], k, folder, SAVE_AT)  # the step a kill before rank 0's k-th file operation leaves
    resume_problems(outs, cases, reference, n)  # [(what, hint)] from a resharded resume

Pure functions of the evidence, so each mistake is named from what the ranks did, not guessed from a
score. The protocol they hold a save to (torch.distributed.checkpoint's docs; torchtitan's
checkpointer): every rank writes its own shards (`*.distcp`) into `step_N.tmp/` while training goes
on; DCP's coordinator writes `.metadata` last; only then is the folder renamed to `step_N/`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed.checkpoint as dcp

from m11_helpers.compare import max_diff
from m11_helpers.dcp_drill import GRACE_S
from m11_helpers.sharded_checkpoint import step_dir

__all__ = ["FILE_OPS", "TOLERANCE", "save_problems", "shard_share", "checkpoint_problems", "kill_expectation",
           "resume_problems"]

FILE_OPS = ("write", "rename", "mkdir", "remove", "rmdir", "rmtree")
# FSDP2 adds the ranks' gradient shares in another order on 1, 2 and 3 ranks (float addition is not
# associative: ~1e-7), and AdamW's m/√v magnifies the last bits of small gradients; a missed or doubled
# step moves weights by ~lr = 1e-2.
TOLERANCE = 1e-4

_DCP_HINT = ("save with dcp.async_save: each rank writes its own shards and `.metadata` says which slice of each "
             "tensor is where, so a load on another world size finds its slices; files of your own, one per rank, "
             "hold a rank's shards of THIS world size and cannot be resharded")


def _tmp(folder, step: int) -> str:
    return str(step_dir(Path(folder).resolve(), step)) + ".tmp"


def save_problems(outs: list[dict], folder, save_at: tuple[int, ...]) -> list[tuple[str, str]]:
    """What a clean run of `save_run` shows wrong, in the order a learner should fix it."""
    problems, tmps = [], {_tmp(folder, s) for s in save_at}
    for r, out in enumerate(outs):
        gate = out["gates"][0] if out["gates"] else None
        if gate is None:
            problems.append((f"each rank to write its shards with DCP (rank {r} wrote no *.distcp file while saving)", _DCP_HINT))
        elif gate == "training thread":
            problems.append((f"the write to run beside training (rank {r} wrote its shards on the training thread: a synchronous save)",
                             "dcp.save (or any write inside save_async) stops training for the whole write: call "
                             "dcp.async_save, which returns once the state is staged in memory"))
        elif gate == "no step began":
            problems.append((f"a training step to run while rank {r}'s write was in flight (none began within "
                             f"{GRACE_S:g} s: save_async waited for the write)",
                             "do not wait on async_save's future inside save_async: publish from its "
                             "done-callback and return a future of your own, and training goes on"))
        outside = sorted({e[2] for e in out["events"] if e[1] == "write" and os.path.dirname(e[2]) not in tmps})
        if outside:
            problems.append((f"every file written inside a fresh step_N.tmp/ (rank {r} wrote "
                             f"{Path(outside[0]).relative_to(Path(folder).resolve())})",
                             "write each save into its own step_N.tmp/ and rename it only when whole: writing "
                             "over the one checkpoint there is (or into step_N/ itself) lets a kill in mid-write "
                             "tear the only copy"))
    events = outs[0]["events"]
    for s in save_at:
        tmp, final = _tmp(folder, s), str(step_dir(Path(folder).resolve(), s))
        meta = [e[0] for e in events if e[1] == "rename" and e[2][1] == os.path.join(tmp, ".metadata")]
        pub = [e[0] for e in events if e[1] == "rename" and e[2] == [tmp, final]]
        if not pub:
            problems.append((f"step {s} published: step_N.tmp/ renamed to step_N/ by rank 0 (no such rename)",
                             "once the save's future is done, rank 0 renames step_N.tmp to step_N (os.replace)"))
        elif not meta or pub[0] < meta[0]:
            problems.append((f"step {s} published only after its write finished (the rename to step_N/ came "
                             "before DCP's .metadata landed)",
                             "publish in the future's done-callback (or after future.result()): until then a "
                             "kill leaves a published folder with missing or half-written shards"))
    return problems


def shard_share(path) -> float:
    """The largest fraction of a checkpoint's data bytes one rank's file holds (1/N when the shards are even)."""
    sizes = [p.stat().st_size for p in Path(path).glob("*.distcp")]
    return max(sizes) / max(sum(sizes), 1) if sizes else 1.0


def checkpoint_problems(path, world: int) -> list[tuple[str, str]]:
    """What a published checkpoint folder lacks: AdamW's state, or shards spread over the ranks that wrote it."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        return [(f"a DCP checkpoint in {path.name}/ (it has no .metadata)", _DCP_HINT)]
    keys = list(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    if not any("exp_avg_sq" in k for k in keys):
        return [(f"AdamW's state in the checkpoint (its {len(keys)} entries: {', '.join(keys[:2])}, …, no "
                 "exp_avg_sq: no optimizer state)",
                 "save AdamW's state too (get_state_dict(model, opt) gives both): without its moments and step "
                 "count, a resumed run takes other steps than the uninterrupted one")]
    share, limit = shard_share(path), (1 + 1 / world) / 2
    if share > limit:
        return [(f"each rank's shards in its own file (one file holds {share:.0%} of the bytes, even shards "
                 f"{1 / world:.0%}: the state was gathered onto one rank)",
                 "save get_state_dict(model, opt) as it comes, each rank its own shards; a full state dict "
                 "funnels every byte through one process (and one process's memory)")]
    return []


def kill_expectation(rank0: dict, k: int, folder, save_at: tuple[int, ...]) -> int:
    """The newest step a kill just before rank 0's k-th file operation of the last save must leave published.

    `rank0` and `folder`: the clean run's rank 0 and its folder; the operations are those it made after the
    last save() began (a save killed before them is the same code, so makes them in the same order); once the one that
    publishes step_N/ is done, losing it would lose a checkpoint that was whole.
    """
    events = rank0["events"]
    start = next(e[0] for e in events if e[1] == "save_call" and e[2] == save_at[-1])
    ops = [e for e in events if e[0] > start and e[1] in FILE_OPS]
    final = str(step_dir(Path(folder).resolve(), save_at[-1]))
    pub = next((i for i, e in enumerate(ops) if e[1] == "rename" and e[2][1] == final), len(ops))
    return save_at[-1] if k > pub else save_at[-2]


def resume_problems(outs: list[dict], cases: list[tuple[str, int | None]], reference: dict,
                    world: int) -> list[tuple[str, str]]:
    """Rank 0's outcome per case (what, the step its load must return) on `world` ranks, against the reference."""
    problems = []
    for (what, want), out in zip(cases, outs):
        got = out["step"]
        if got != want:
            hint = ("load only published step_N/ folders (never step_N.tmp/: a killed save's) and take the newest"
                    if want is not None else "return None when the folder holds no published checkpoint")
            if isinstance(want, int) and got == want - 1:
                hint = "return the step the checkpoint was saved at: the next step to run"
            problems.append((f"load_newest to return {want!r} for {what} (the newest published step; got {got!r})", hint))
        elif got is not None and out["model_diff"]:
            problems.append((f"the weights loaded on {world} ranks from {what} bitwise equal to the saved "
                             f"ones (they differ at {', '.join(out['model_diff'][:2])})",
                             "load with dcp.load into get_state_dict(model, opt)'s layout, then set_state_dict: "
                             "each rank reads the slices its new shards need"))
        elif got is not None and out["optim_diff"]:
            problems.append((f"AdamW's state loaded on {world} ranks from {what} bitwise equal to the "
                             f"saved one (it differs at {', '.join(out['optim_diff'][:2])})",
                             "save and load the optimizer's state too, through get_state_dict(model, opt) and "
                             "set_state_dict: a fresh AdamW's own state_dict() is empty, so dcp.load has nothing "
                             "to fill, and without its moments the next step is another step"))
        elif got is not None:
            gap = max_diff(out["final"], reference)
            if not gap <= TOLERANCE:
                problems.append((f"{what}, resumed on {world} ranks, within {TOLERANCE:g} of a one-process "
                                 f"run (off by {gap:.1e})", "resume at the step load_newest returns"))
    return problems

