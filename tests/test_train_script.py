"""The reference script on real gloo ranks: against one process, one reduction per step, resharding resume within
float-summation tolerance, SIGKILL/SIGTERM/crash + resume bit-identical (elastic restarts under `accelerate launch`:
test_elastic_restart.py).

One chain of runs serves every comparison: an uninterrupted 2-rank run (module-scoped), 4 ranks resumed from its
step 8, 2 ranks resumed from those 4 ranks' step 10; the fault drills start from the 2-rank run's checkpoints and
must end on its weights, bit for bit. Runs that need no process of their own share a launch, one after another in
the same ranks (the accumulation runs after the uninterrupted one; the spot notice after the resume from 4 ranks): a
launch's forks and DTensor's first-use costs, about 1 s of CPU per 2-rank launch, are paid once. Resharding
tolerance: a different number of ranks sums each gradient element's per-rank partial sums in a different order (and
each rank's local mean runs over a different number of rows), so gradients differ by a few fp32 ulp (2^-23 ≈ 1.2e-7
relative). AdamW divides each element by its own running RMS, which carries a relative error unchanged but lets an
element whose partial sums nearly cancel take a visibly different (still ≤ lr) step: losses agree to rtol 1e-5
(measured ≤ 1.9e-7 over 36 steps), weights to atol 1e-4 = lr/30 (measured ≤ 7e-6 over 8 steps, 2.4e-5 over 36).
"""

import functools
import random
import shutil
import signal

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from m11_helpers.config import TINY_GPT, param_count
from m11_helpers.data import tokens
from m11_helpers.fault_tolerance import batch_indices
from m11_helpers.fsdp import TrafficCounter
from m11_helpers.launch import LaunchError, launch
from m11_helpers.lr_schedule import lr_factor, warmup_cosine
from m11_helpers.meta_init import materialize
from m11_helpers.models import TinyGPT
from m11_helpers.reference_run import SendSignal, loss_curve, run_train, script_module
from m11_helpers.resources import script_path
from m11_helpers.sharded_checkpoint import complete_steps, step_dir
from m11_helpers.throughput import chip_for, device_peak, step_throughput

STEPS = 12
COMMON = ["--steps", STEPS, "--ckpt-every", 4, "--keep", 10, "--log-every", 100]
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-4  # the resharding tolerance (module docstring)


class KeepWeights:
    """Observer: the full final weights, gathered to rank 0's CPU (None elsewhere)."""

    weights = None

    def on_end(self, model):
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        self.weights = {k: v.clone() for k, v in full.items()} if dist.get_rank() == 0 else None


def train_keep_weights(*argv):
    obs = KeepWeights()
    return run_train(*argv, observer=obs), obs.weights


ACCUMULATION = {"fsdp2": ["--bf16", "--ac"], "ddp": ["--ac"]}  # FSDP2 in bf16 + recompute; DDP in fp32


def uninterrupted_then_accumulation(folder):
    """One 2-rank launch: the uninterrupted run, then each accumulation run (3 steps, 2 micro-batches)."""
    result, weights = train_keep_weights(*COMMON, "--ckpt-dir", folder)
    accum = {parallel: count_reductions("--parallel", parallel, "--accum", 2, "--steps", 3, "--warmup", 1, *extra)
             for parallel, extra in ACCUMULATION.items()}
    return result, weights, accum


@pytest.fixture(scope="module")
def ref2(tmp_path_factory):
    """The uninterrupted run: 2 ranks, 12 steps, checkpoints at 4, 8 and 12 (and, in the same launch, the
    accumulation runs: rank 0's losses, reductions per step and FSDP units of each)."""
    folder = tmp_path_factory.mktemp("ref2")
    result, weights, accum = launch(uninterrupted_then_accumulation, folder, num_processes=2, timeout=240,
                                    show_output=False)[0]
    return {"result": result, "weights": weights, "dir": folder, "accum": accum}


@pytest.fixture(scope="module")
def on4(ref2, tmp_path_factory):
    """4 ranks resumed from the 2-rank run's step 8 (resharded), to step 12; checkpoints at 10 and 12."""
    folder = _copy_checkpoint(ref2["dir"], 8, tmp_path_factory.mktemp("on4"))
    result, weights = launch(train_keep_weights, *COMMON, "--ckpt-every", 2, "--ckpt-dir", folder, num_processes=4,
                             timeout=240, show_output=False)[0]  # rank 0's result and weights
    return {"result": result, "weights": weights, "dir": folder}


def _copy_checkpoint(src, step, dst):
    shutil.copytree(step_dir(src, step), step_dir(dst, step))
    return dst


@functools.cache  # the two accumulation tests share the 3-step one
def _single_process_losses(steps, batch=16, lr=3e-3, seed=0, warmup=4):
    """The same training in one process, written out plainly: no wrapper, full-batch mean loss."""
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT)
    materialize(model, "cpu", seed=seed)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=True)
    sched = warmup_cosine(opt, warmup=warmup, total=steps, floor=0.1)
    x_all, y_all = tokens(n=2048, seed=seed).tensors
    losses = []
    for s in range(steps):
        idx = batch_indices(s, batch, len(x_all), seed=seed)
        loss = F.cross_entropy(model(x_all[idx]).flatten(0, 1), y_all[idx].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return tuple(losses)


def test_fsdp2_on_2_and_4_ranks_matches_one_process(ref2, on4):
    single = list(_single_process_losses(STEPS))
    r, q = ref2["result"], on4["result"]
    assert r["steps"] == list(range(STEPS)) and r["world"] == 2 and q["steps"] == list(range(8, STEPS)) and q["world"] == 4
    torch.testing.assert_close(r["losses"], single, rtol=LOSS_RTOL, atol=0)
    torch.testing.assert_close(q["losses"], single[8:], rtol=LOSS_RTOL, atol=0)  # 4 steps on 4 ranks
    assert r["losses"][-1] < r["losses"][0] - 0.3  # it learns
    assert complete_steps(ref2["dir"]) == [4, 8, 12]  # --keep 10: nothing deleted yet


class CountReductions:
    """Observer: gradient reductions per optimizer step (FSDP2 reduce-scatters; DDP all-reduce rounds)."""

    def on_build(self, model):
        self.per_step, self.units = [], sum(isinstance(m, FSDPModule) for m in model.modules())
        if isinstance(model, DDP):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            self.rounds = 0

            def hook(state, bucket):
                self.rounds += bucket.is_last()  # a round = every bucket once; the last closes it
                return allreduce_hook(state, bucket)

            model.register_comm_hook(None, hook)
        else:
            self.counter = TrafficCounter().attach(model)

    def on_step(self, record):
        if hasattr(self, "counter"):
            self.per_step.append(self.counter.calls("reduce_scatter"))
            self.counter.reset()
        else:
            self.per_step.append(self.rounds)
            self.rounds = 0


def count_reductions(*argv):
    obs = CountReductions()
    out = run_train(*argv, observer=obs)
    return out["losses"], obs.per_step, obs.units


# FSDP2 in bf16 (MixedPrecisionPolicy) agrees with fp32 to bf16's precision; DDP in fp32 to float summation
@pytest.mark.parametrize("parallel,rtol", [("fsdp2", 2e-2), ("ddp", LOSS_RTOL)])
def test_accumulation_reduces_gradients_once_per_step(ref2, parallel, rtol):
    losses, per_step, units = ref2["accum"][parallel]  # run in the uninterrupted run's launch, after it
    if parallel == "fsdp2":  # one reduce-scatter per FSDP unit (4 blocks + the root) per step, not 2 × that
        assert units == TINY_GPT.layers + 1 and per_step == [units] * 3
    else:
        assert per_step == [1] * 3  # one all-reduce round per step, not one per micro-batch
    torch.testing.assert_close(losses, list(_single_process_losses(3, warmup=1)), rtol=rtol, atol=0)


def test_resume_on_4_ranks_from_a_2_rank_checkpoint(ref2, on4):
    r, w = on4["result"], on4["weights"]
    assert r["resumed"]["saved_world_size"] == 2 and r["resumed"]["resharded"] and r["steps"] == list(range(8, STEPS))
    torch.testing.assert_close(r["losses"], ref2["result"]["losses"][8:], rtol=LOSS_RTOL, atol=0)
    torch.testing.assert_close(w, ref2["weights"], rtol=0, atol=WEIGHT_ATOL)


def train_until_signal(plan, *argv):
    return run_train(*argv, observer=SendSignal(*plan))


def back_on_2_then_spot_notice(from4, spot):
    """One 2-rank launch: the resume from the 4-rank checkpoint (to the end), then the spot-notice run: from
    the uninterrupted run's step 4, a SIGTERM to rank 1 only after step 5 (the ranks agree at the next step)."""
    back = train_keep_weights(*COMMON, "--ckpt-dir", from4)
    return back, train_until_signal((5, signal.SIGTERM, 1), *COMMON, "--ckpt-dir", spot)


@pytest.fixture(scope="module")
def on2(ref2, on4, tmp_path_factory):
    from4 = _copy_checkpoint(on4["dir"], 10, tmp_path_factory.mktemp("from4"))  # the 4-rank run's step 10
    spot = _copy_checkpoint(ref2["dir"], 4, tmp_path_factory.mktemp("spot"))  # the uninterrupted run's step 4
    out = launch(back_on_2_then_spot_notice, from4, spot, num_processes=2, timeout=240, show_output=False)
    return {"from4": out[0][0], "spot": spot, "part": [r[1] for r in out]}


def test_resume_on_2_ranks_from_a_4_rank_checkpoint(on4, on2):
    r, w = on2["from4"]  # against the 4-rank run it was written by
    assert r["resumed"]["saved_world_size"] == 4 and r["resumed"]["resharded"] and r["steps"] == list(range(10, STEPS))
    torch.testing.assert_close(r["losses"], on4["result"]["losses"][2:], rtol=LOSS_RTOL, atol=0)
    torch.testing.assert_close(w, on4["weights"], rtol=0, atol=WEIGHT_ATOL)


def test_spot_notice_crash_and_sigkills_at_random_moments_then_resume_is_bit_identical(ref2, on2):
    # one chain in one folder, from the uninterrupted run's step 4: a SIGTERM to rank 1 only (the ranks agree at
    # the next step and checkpoint it; run in on2's launch), a crash drill, then resumed runs SIGKILLed right after
    # the async save of step 8 began (its files being written) and mid-step at a seeded random moment, then the
    # run that finishes: bit-identical to the uninterrupted one
    tmp_path, part = on2["spot"], on2["part"]
    assert [p["preempted_at"] for p in part] == [6, 6] and complete_steps(tmp_path) == [4, 6]
    # the drills fire on their own attempt (torchrun's restart count; 0 here), the first in step order:
    # the crash at step 6, raised on the last rank before the step runs; nothing saved is touched
    with pytest.raises(LaunchError, match="injected crash on rank 1 at step 6"):
        launch(run_train, *COMMON, "--ckpt-dir", tmp_path, "--crash-at", 6, "--hang-at", 9, num_processes=2,
               show_output=False)
    assert complete_steps(tmp_path) == [4, 6] and not list(tmp_path.glob("*.tmp"))
    rng = random.Random(22)
    seen = []
    for at, rank, delay in [(7, rng.randrange(2), 0.0), (rng.choice([9, 10]), rng.randrange(2), rng.uniform(0, 0.05))]:
        with pytest.raises(LaunchError, match="SIGKILL"):
            launch(train_until_signal, (at, signal.SIGKILL, rank, delay), *COMMON, "--ckpt-dir", tmp_path,
                   num_processes=2, show_output=False, timeout=240)
        seen.append((complete_steps(tmp_path), sorted(p.name for p in tmp_path.glob("*.tmp"))))
    # the kill during the save of step 8: step_8 stayed a .tmp folder, steps 4 and 6 intact and complete
    assert seen[0] == ([4, 6], [step_dir(tmp_path, 8).name + ".tmp"])
    newest = complete_steps(tmp_path)[-1]  # 8 once the next run (from 6, the stale .tmp ignored) saved it again
    assert seen[1][0][:2] == [4, 6] and newest in (6, 8)
    done = launch(run_train, *COMMON, "--ckpt-dir", tmp_path, num_processes=2, show_output=False, timeout=240)[0]
    assert done["resumed"]["step"] == newest and not done["resumed"]["resharded"]
    assert not list(tmp_path.glob("*.tmp"))  # stale .tmp cleaned up
    assert done["checksum"] == ref2["result"]["checksum"]  # the same weights, bit for bit
    assert loss_curve(part[0], done) == {s: v for s, v in loss_curve(ref2["result"]).items()
                                         if 4 <= s < 6 or s >= newest}


def test_throughput_and_peak_labels():
    assert chip_for("NVIDIA H100 80GB HBM3") == "H100 SXM" and chip_for("NVIDIA H100 PCIe") is None
    assert chip_for("NVIDIA A100-SXM4-80GB") == "A100 SXM 80GB" and chip_for("Tesla T4") is None
    peak, source = device_peak(torch.device("cpu"), "fp32", matmul_n=64)
    assert peak > 0 and source.startswith("no datasheet peak for this CPU: measured")
    t = step_throughput(tokens=512, seconds=0.5, model=1000, world_size=2, peak_flops=1e9)
    assert t["tokens_per_s"] == 1024 and t["mfu"] == t["hfu"] == pytest.approx(6 * 1000 * 1024 / 2e9)
    g = step_throughput(512, 0.5, TINY_GPT, 2, 1e9, recompute="full")  # a config: attention counted, 8N with --ac
    n, attn = param_count(TINY_GPT), 12 * TINY_GPT.layers * TINY_GPT.hidden * TINY_GPT.seq_len
    assert g["mfu"] == pytest.approx((6 * n + attn) * 1024 / 2e9) and g["hfu"] == pytest.approx(g["mfu"] * 4 / 3)
    half = step_throughput(512, 0.5, TINY_GPT, 2, 1e9, recompute="full", share=0.5)  # --ac-every 2: half the blocks
    assert half["hfu"] == pytest.approx((g["mfu"] + g["hfu"]) / 2) and half["mfu"] == g["mfu"]
    with pytest.raises(ValueError, match="share"):
        step_throughput(512, 0.5, TINY_GPT, 2, 1e9, recompute="full", share=1.5)
    with pytest.raises(ValueError, match="dtype"):
        device_peak(torch.device("cpu"), "fp8")


def test_warmup_cosine_schedule():
    f = [lr_factor(s, warmup=4, total=12) for s in range(14)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0] and f[12] == f[13] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[3:], f[4:]))  # decays monotonically after the warmup
    assert lr_factor(8, warmup=4, total=12, floor=0.0) == pytest.approx(0.5)  # half-way down the cosine
    with pytest.raises(ValueError, match="warmup"):
        lr_factor(0, warmup=13, total=12)
    with pytest.raises(ValueError, match="floor"):
        lr_factor(0, warmup=1, total=12, floor=1.5)


def sharded_initial_weights():
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    materialize(model, "cpu", seed=0)
    assert model.head.weight is model.wte.weight  # still tied after to_empty
    return {k: v.clone() for k, v in get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)).items()}


def test_meta_init_gives_every_world_size_the_same_weights():
    with torch.device("meta"):
        one = TinyGPT(TINY_GPT)
    materialize(one, "cpu", seed=0)
    three = launch(sharded_initial_weights, num_processes=3, show_output=False)[0]  # 64 rows → 22/22/20: uneven
    assert three.keys() == one.state_dict().keys()
    assert all(torch.equal(three[k], v) for k, v in one.state_dict().items())
    with torch.device("meta"):
        norm = torch.nn.BatchNorm1d(4)  # running statistics are buffers: to_empty leaves them garbage
    with pytest.raises(ValueError, match="buffers"):
        materialize(norm, "cpu")


def test_the_gpu_config_starts_the_processes_and_leaves_the_rest_to_the_script(monkeypatch):
    # what `accelerate launch --config_file fsdp_gpu.yaml train.py ...` resolves to (no processes started;
    # test_elastic_restart.py runs the script under accelerate launch for real)
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    argv = ["--config_file", str(script_path("configs/fsdp_gpu.yaml")), str(script_path("train.py")), "--accum", "2"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    assert args.multi_gpu and not args.use_fsdp and not args.use_deepspeed and args.num_processes == 8
    assert args.mixed_precision == "no"  # precision is the script's --bf16, not a second autocast
    flags = script_module().parse(args.training_script_args)
    assert flags.parallel == "fsdp2" and flags.accum == 2 and flags.clip == 1.0  # accumulation, clipping: the script's
    assert not script_path("configs/fsdp_gpu.yaml").with_name("deepspeed_gpu.yaml").exists()
