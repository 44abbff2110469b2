"""DCP checkpoints on real gloo ranks: each rank writes its own shards; a 4-rank checkpoint loads exactly on
2 ranks (and a DDP one into FSDP2); RNG per rank; completeness by rename; retention; and why a
rank-0 torch.save of an FSDP2 model cannot do any of this."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from m11_helpers.config import TINY_GPT
from m11_helpers.launch import launch
from m11_helpers.lr_schedule import warmup_cosine
from m11_helpers.meta_init import materialize
from m11_helpers.models import TinyGPT, tiny_gpt
from m11_helpers.sharded_checkpoint import (
    Checkpointer,
    complete_steps,
    latest_complete,
    retained,
    saved_world_size,
    step_dir,
)

FULL = StateDictOptions(full_state_dict=True)


def _model(parallel):
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT)
    if parallel == "fsdp2":
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    materialize(model, "cpu", seed=0)
    if parallel == "ddp":
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, warmup_cosine(opt, warmup=1, total=10)


def _full(model, opt):
    return ({k: v.clone() for k, v in get_model_state_dict(model, options=FULL).items()},
            get_optimizer_state_dict(model, opt, options=FULL)["state"])


def save_after_training(folder, parallel, async_save, keep=3):
    model, opt, sched = _model(parallel)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(2):  # different data per rank, as in data parallelism
        x = torch.randint(0, 64, (2, 32), generator=g)  # (b, T)
        model(x, x).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    torch.manual_seed(100 + dist.get_rank())  # each rank's own random stream
    ckpt = Checkpointer(folder, keep=keep, async_save=async_save)
    for step in (0, 1, 2) if keep < 3 else (2,):  # with keep=2, steps 0 and 1 make retention delete one
        ckpt.save(step, model, opt, scheduler=sched, progress={"step": 2, "cursor": 9, "skipped": [[3, 4]]})
    ckpt.wait()
    weights, optim = _full(model, opt)
    return {"weights": weights, "optim": optim, "next_draw": torch.rand(2), "sched": sched.state_dict(),
            "last_complete": ckpt.last_complete}


def load_fresh(folder, parallel):
    model, opt, sched = _model(parallel)
    progress = {"step": 0, "cursor": 0, "skipped": []}
    info = Checkpointer(folder).load(model, opt, scheduler=sched, progress=progress)
    weights, optim = _full(model, opt)
    return {"info": info, "weights": weights, "optim": optim, "progress": progress, "sched": sched.state_dict(),
            "next_draw": torch.rand(2)}


def _assert_same_state(a, b):
    assert a["weights"].keys() == b["weights"].keys() and a["optim"].keys() == b["optim"].keys()
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    for k in a["optim"]:
        for s in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a["optim"][k][s], b["optim"][k][s]), (k, s)


def on_4_ranks(folder, path):
    """One 4-rank launch: an FSDP2 run's async DCP saves (keep=2), then the naive rank-0 torch.save of its shards."""
    return save_after_training(folder, "fsdp2", True, keep=2), rank0_torch_save(path)


def on_2_ranks(folder, path, own):
    """One 2-rank launch: the DCP checkpoint loaded into 2 shards, the rank-0 file tried on 2 ranks, then a
    2-rank run's own save and loads in `own` (`save_then_load`)."""
    return load_fresh(folder, "fsdp2"), rank0_file_load(path), save_then_load(own)


@pytest.fixture(scope="module")
def saved4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dcp")
    out = launch(on_4_ranks, folder, folder.with_name(folder.name + "-rank0.pt"), num_processes=4, show_output=False)
    return {"folder": folder, "path": folder.with_name(folder.name + "-rank0.pt"), "dcp": [r[0] for r in out],
            "naive": [r[1] for r in out]}


@pytest.fixture(scope="module")
def loaded2(saved4, tmp_path_factory):
    own = tmp_path_factory.mktemp("dcp2")
    out = launch(on_2_ranks, saved4["folder"], saved4["path"], own, num_processes=2, show_output=False)
    return {"dcp": [r[0] for r in out], "naive": [r[1] for r in out], "same_world": [r[2] for r in out]}


def test_save_on_4_load_on_2_reshards_model_and_optimizer_exactly(saved4, loaded2):
    saved, tmp_path = saved4["dcp"], saved4["folder"]
    folder = step_dir(tmp_path, 2)
    files = sorted(p.name for p in folder.iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    sizes = [(folder / f).stat().st_size for f in files[1:]]
    assert max(sizes) < 0.4 * sum(sizes)  # each rank wrote its own quarter: nothing gathered on rank 0
    assert saved_world_size(folder) == 4 and latest_complete(tmp_path) == folder
    for r in loaded2["dcp"]:
        assert r["info"] == {"step": 2, "path": str(folder), "saved_world_size": 4, "world_size": 2,
                             "resharded": True}
        _assert_same_state(saved[0], r)  # bit for bit, though every shard boundary moved
        assert r["progress"] == {"step": 2, "cursor": 9, "skipped": [[3, 4]]} and r["sched"] == saved[0]["sched"]


def test_retention_keeps_the_newest_k_on_real_saves(saved4):
    # the 4-rank run saved steps 0, 1 and 2 with keep=2 (async, each save waiting for the previous one)
    assert [r["last_complete"] for r in saved4["dcp"]] == [2] * 4
    assert complete_steps(saved4["folder"]) == [1, 2] and not list(saved4["folder"].glob("*.tmp"))


def save_then_load(folder):
    """2 ranks: a DDP run's synchronous save, then, with the RNG moved on, loads into a fresh DDP and an FSDP2 model."""
    saved = save_after_training(folder, "ddp", False)
    torch.manual_seed(12345)  # the stream moves on: only a load that restores it gives saved["next_draw"] again
    again = load_fresh(folder, "ddp")
    sharded = load_fresh(folder, "fsdp2")  # DDP → FSDP2 shards
    return saved, again, sharded


def test_same_world_size_restores_every_ranks_rng_and_ddp_loads_into_fsdp2(loaded2):
    out = loaded2["same_world"]  # sync save, in the 2-rank launch (after the 4-rank checkpoint's loads)
    for s, r, _ in out:
        assert not r["info"]["resharded"] and torch.equal(r["next_draw"], s["next_draw"])  # rank r's own stream
        _assert_same_state(s, r)
    assert not torch.equal(out[0][0]["next_draw"], out[1][0]["next_draw"])  # the ranks' streams differ
    _assert_same_state(out[0][0], out[0][2])


def test_completeness_retention_and_stale_folders(tmp_path):
    for step, metadata in ((4, True), (8, False), (12, True), (16, True)):
        step_dir(tmp_path, step).mkdir()
        if metadata:
            (step_dir(tmp_path, step) / ".metadata").write_bytes(b"")
    step_dir(tmp_path, 20).with_suffix(".tmp").mkdir()  # a save killed before its rename
    assert complete_steps(tmp_path) == [4, 12, 16] and latest_complete(tmp_path) == step_dir(tmp_path, 16)
    assert retained([4, 12, 16], 2) == [12, 16] and retained([4], 3) == [4]
    assert complete_steps(tmp_path / "missing") == [] and latest_complete(tmp_path / "missing") is None
    Checkpointer(tmp_path)  # one process, no process group: rank 0 deletes what can never complete
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError, match="keep"):
        retained([1], 0)
    with pytest.raises(ValueError, match="keep"):
        Checkpointer(tmp_path, keep=0)
    with pytest.raises(ValueError, match="step"):
        step_dir(tmp_path, -1)


def rank0_torch_save(path):
    """The naive checkpoint: rank 0 torch.saves its model.state_dict() (FSDP2: its DTensor shards), then
    the same 4 ranks load that file into a model with other weights."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = fully_shard(tiny_gpt(0), mesh=mesh)
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()
    truth = {k: v.clone() for k, v in get_model_state_dict(model, options=FULL).items()}
    return truth, rank0_file_load(path)


def rank0_file_load(path):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = fully_shard(tiny_gpt(1), mesh=mesh)  # other initial weights: the load must overwrite them
    state = torch.load(path, weights_only=False)  # DTensors: weights_only refuses them
    rows = state["wte.weight"].to_local().shape[0]
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        return {"rows_in_file": rows, "error": str(exc)}
    return {"rows_in_file": rows, "error": None,
            "weights": {k: v.clone() for k, v in get_model_state_dict(model, options=FULL).items()}}


def test_rank0_torch_save_of_fsdp2_shards_cannot_reshard_and_silently_corrupts(saved4, loaded2):
    on4 = saved4["naive"]  # the 4-rank launch, after its DCP saves
    truth, again = on4[0]
    # the file holds rank 0's quarter only (16 of 64 rows), and its DTensors name a 4-rank mesh
    assert again["rows_in_file"] == TINY_GPT.vocab_size // 4
    assert all(r[1]["error"] is None for r in on4)  # on the same 4 ranks it "loads"...
    w = again["weights"]["wte.weight"]  # ...but every rank took rank 0's rows as its own
    assert torch.equal(w[16:32], truth["wte.weight"][:16]) and not torch.equal(w, truth["wte.weight"])
    assert "different meshes" in loaded2["naive"][0]["error"]  # and on 2 ranks it cannot load at all
