"""True version floors: the declared minimums cover the APIs the code uses, and where the code uses
something newer than the floor, its fallback works with the newer API hidden (real gloo ranks).

Floors (pyproject.toml, README "Tested versions"): torch 2.6 for FSDP2's public
`torch.distributed.fsdp.fully_shard`; accelerate 1.6 for `FullyShardedDataParallelPlugin(fsdp_version=2)`.
Newer than the floor, with a fallback tested here: the `*_single` collectives (torch 2.13),
`distribute_tensor(..., src_data_rank=)` (torch 2.7, `meta_init`), and FSDP2's private default
collectives (only `fsdp.TrafficCounter` needs them, and says so).
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from packaging.requirements import Requirement
from packaging.version import Version
from torch.distributed.tensor import distribute_tensor

from m11_helpers.launch import launch, rank_device

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CORE = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


def _floor(name: str) -> Version:
    req = next(r for r in CORE if r.name.lower() == name)
    return min(Version(s.version) for s in req.specifier if s.operator == ">=")


# API used -> (distribution, first version with it at that location[, the test in this file that runs
# the code's fallback with the API hidden]); a fallback test is required when the version is newer than
# the declared floor. Sources: each project's release notes and pull requests.
FLOORS = {
    r"from torch\.distributed\.fsdp import [^\n]*fully_shard": ("torch", "2.6"),
    r"torch\.distributed\.tensor\b": ("torch", "2.5"),
    r"torch\.distributed\.pipelining": ("torch", "2.4"),
    r"torch\.amp\.GradScaler\(": ("torch", "2.3"),
    r"register_post_accumulate_grad_hook": ("torch", "2.1"),
    r"FullyShardedDataParallelPlugin\(fsdp_version": ("accelerate", "1.6"),
    # pytorch/pytorch#143883 (opened 2024-12-26, after the 2.6 branch cut)
    r"src_data_rank\s*=": ("torch", "2.7", "test_meta_init_falls_back_when_distribute_tensor_has_no_src_data_rank"),
    r"\b(reduce_scatter|all_gather)_single\b": ("torch", "2.13",
                                              "test_collectives_fall_back_when_torch_has_no_single_collectives"),
}
PRIVATE_OLD_HOMES = r"torch\.distributed\._composable\.fsdp|torch\.distributed\._tensor\b"


def _sources() -> dict[str, str]:
    import nbformat

    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "m11_helpers").rglob("*.py")}
    for folder in ("course", "solutions"):
        for p in (ROOT / folder).glob("[0-9][0-9]_*.ipynb"):
            texts[str(p.relative_to(ROOT))] = "\n".join(c.source for c in nbformat.read(p, as_version=4).cells
                                                        if c.cell_type == "code")
    return texts


def test_declared_floors_cover_the_apis_the_code_uses() -> None:
    texts = _sources()
    low = []
    for pattern, (dist_name, since, *fallback) in FLOORS.items():
        users = [f for f, t in texts.items() if re.search(pattern, t)]
        if users and _floor(dist_name) < Version(since) and not (fallback and callable(globals().get(fallback[0]))):
            low.append(f"{pattern!r} needs {dist_name}>={since} (used in {users[:3]}), floor is {_floor(dist_name)}, "
                       "and no test here runs a fallback with it hidden")
    assert not low, low
    old = [f for f, t in texts.items() if re.search(PRIVATE_OLD_HOMES, t)]
    assert not old, f"pre-2.6 private import locations: {old}"


def _hide(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch < 2.13: no `*_single` collectives (forked ranks inherit the patched module)."""
    monkeypatch.delattr(dist, "reduce_scatter_single")
    monkeypatch.delattr(dist, "all_gather_single")


def _collectives_without_single() -> tuple[torch.Tensor, torch.Tensor]:
    from m11_helpers.collectives import backend_all_gather, backend_reduce_scatter

    # on a torch without `*_single` the older names are current, not deprecated
    warnings.filterwarnings("ignore", r".*(reduce_scatter_tensor|all_gather_into_tensor).*deprecated", FutureWarning)
    assert not hasattr(dist, "reduce_scatter_single")
    rank, n = dist.get_rank(), dist.get_world_size()
    full = torch.arange(4 * n, dtype=torch.float32, device=rank_device()) * (rank + 1)  # (4N,)
    shard = full.new_empty(4)  # (4,)
    backend_reduce_scatter(shard, full)
    gathered = full.new_empty(4 * n)  # (4N,)
    backend_all_gather(gathered, shard)
    return shard, gathered


def test_collectives_fall_back_when_torch_has_no_single_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch)
    n = 2
    out = launch(_collectives_without_single, num_processes=n, show_output=False, timeout=120)
    total = sum(torch.arange(4 * n, dtype=torch.float32) * (r + 1) for r in range(n))  # one-process reference
    for rank, (shard, gathered) in enumerate(out):
        torch.testing.assert_close(shard, total[4 * rank:4 * rank + 4])
        torch.testing.assert_close(gathered, total)


def _sharded_adamw_without_single() -> bool:
    from m11_helpers.zero_optimizer import compare_with_adamw

    warnings.filterwarnings("ignore", r".*(reduce_scatter_tensor|all_gather_into_tensor).*deprecated", FutureWarning)
    return compare_with_adamw(steps=1, sizes=(3, 4))["bitwise_equal"]


def test_zero_optimizer_runs_on_a_torch_without_single_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch)
    assert all(launch(_sharded_adamw_without_single, num_processes=2, show_output=False, timeout=120))


def _distribute_tensor_2_6(tensor, device_mesh=None, placements=None):
    """torch 2.6's `distribute_tensor`: no `src_data_rank` (the call then raises TypeError naming it)."""
    _OLD_CALLS.append(1)
    return distribute_tensor(tensor, device_mesh, placements)


_OLD_CALLS: list[int] = []  # each forked rank appends to its own copy


def _sharded_initial_weights() -> tuple[dict[str, torch.Tensor], int]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from m11_helpers.config import TINY_GPT
    from m11_helpers.meta_init import materialize
    from m11_helpers.models import TinyGPT

    with torch.device("meta"):
        model = TinyGPT(TINY_GPT)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    materialize(model, "cpu", seed=0)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.clone() for k, v in full.items()}, len(_OLD_CALLS)


def test_meta_init_falls_back_when_distribute_tensor_has_no_src_data_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from m11_helpers import meta_init
    from m11_helpers.config import TINY_GPT
    from m11_helpers.models import TinyGPT

    monkeypatch.setattr(meta_init, "distribute_tensor", _distribute_tensor_2_6)  # inherited by the forked ranks
    (weights, old_calls), _ = launch(_sharded_initial_weights, num_processes=2, show_output=False, timeout=120)
    assert old_calls > 0, "the fallback did not run"
    with torch.device("meta"):
        one = TinyGPT(TINY_GPT)
    meta_init.materialize(one, "cpu", seed=0)  # the one-process reference
    assert weights.keys() == one.state_dict().keys()
    for k, v in one.state_dict().items():
        torch.testing.assert_close(weights[k], v, rtol=0, atol=0)


def test_fsdp_module_imports_without_the_private_collectives_and_the_counter_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    private = "torch.distributed.fsdp._fully_shard._fsdp_collectives"
    monkeypatch.setitem(sys.modules, private, None)  # `import` of it now raises ImportError
    monkeypatch.delitem(sys.modules, "m11_helpers.fsdp", raising=False)
    fsdp = importlib.import_module("m11_helpers.fsdp")  # importing the lesson module needs no private API
    with pytest.raises(RuntimeError, match="TrafficCounter needs FSDP2's DefaultAllGather"):
        fsdp.TrafficCounter().attach(torch.nn.Linear(2, 2))
    monkeypatch.delitem(sys.modules, "m11_helpers.fsdp")  # the next importer gets the real module back
