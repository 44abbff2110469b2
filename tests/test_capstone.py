"""Lesson 11: the capstone's plan against real runs of the reference script (exact), its build against the script."""

import math

import pytest
import torch

from m11_helpers.activations import activation_bytes
from m11_helpers.capstone_assembly import build_trial, capstone_trial, measured_levers, paired_launch, reference_build
from m11_helpers.capstone_build import CapstoneRun, reference_loop, reference_step, single_process_step, step_trial
from m11_helpers.capstone_gpu import LEVER_CONFIGS, lever_rows, lever_table, predict_gpu_run, step_seconds
from m11_helpers.capstone_measure import compare, sweep
from m11_helpers.capstone_plan import (
    FLAG_GRID,
    Flags,
    comm_elements,
    cpu_bf16_norm_stats,
    fsdp_local_numel,
    fsdp_units,
    param_shapes,
    plan_run,
    rank_model_states,
)
from m11_helpers.config import RUNNING_EXAMPLE, TINY_GPT, TINY_LLAMA, param_count
from m11_helpers.launch import launch
from m11_helpers.model_states import model_state_bytes
from m11_helpers.models import tiny_gpt
from m11_helpers.reference_run import run_train, script_module


def test_param_shapes_count_the_tiny_gpt_exactly():
    shapes = param_shapes(TINY_GPT)
    assert sum(math.prod(s) for s in shapes) == param_count(TINY_GPT) == sum(p.numel() for p in tiny_gpt().parameters())
    assert len(shapes) == 52  # tied head counted once
    blocks, root = fsdp_units(TINY_GPT)
    assert len(blocks) == 4 * 12 and sum(map(math.prod, root)) == 64 * 64 + 32 * 64 + 2 * 64  # embeddings, ln_f


@pytest.mark.parametrize("rows,n", [(64, 4), (5, 4), (7, 3), (1, 2), (192, 3)])
def test_fsdp_local_numel_follows_torch_chunk(rows, n):
    chunks = [c.numel() for c in torch.empty(rows, 3).chunk(n)]
    chunks += [0] * (n - len(chunks))  # chunk() returns fewer pieces when rows < n
    assert [fsdp_local_numel((rows, 3), n, r) for r in range(n)] == chunks


def test_model_states_use_the_layouts_bytes():
    shapes, psi = param_shapes(TINY_GPT), param_count(TINY_GPT)
    for flags in (Flags(), Flags("ddp", bf16=True)):  # "fp32" and "autocast": 4 + 4 + 8, plus AdamW's step
        assert rank_model_states(shapes, 4, flags) == {"parameters": 4 * psi, "gradients": 4 * psi,
                                                      "optimizer": 8 * psi + 4 * 52, "local_params": psi}
    fsdp = [rank_model_states(shapes, 3, Flags("fsdp2", bf16=True), r) for r in range(3)]  # "fsdp2-mp"
    assert sum(s["local_params"] for s in fsdp) == psi and fsdp[0]["parameters"] == 4 * fsdp[0]["local_params"]


def test_flags_argv_levers_and_bad_input():
    f = Flags("fsdp2", bf16=True, ac=True, accum=2)
    assert f.argv() == ["--parallel", "fsdp2", "--bf16", "--ac", "--accum", "2"] and f.levers == 4
    assert str(f) == "FSDP2 + bf16 + AC + accum 2" and Flags().levers == 0
    assert len(FLAG_GRID) == 24 and len(set(FLAG_GRID)) == 24
    with pytest.raises(ValueError, match="parallel"):
        Flags("zero9")
    with pytest.raises(ValueError, match="accum"):
        Flags(accum=0)
    with pytest.raises(ValueError, match="batch"):
        plan_run(Flags(accum=4), 3, 16)
    with pytest.raises(ValueError, match="rank"):
        fsdp_local_numel((4, 4), 2, 2)
    with pytest.raises(ValueError, match="cfg.norm"):
        cpu_bf16_norm_stats(TINY_LLAMA, 1)


def test_plan_takes_activations_from_the_one_helper():
    p = plan_run(Flags("fsdp2", accum=2), 2, 16)
    assert p["micro_batch"] == 4 and p["activations"] == activation_bytes(TINY_GPT, 4, flash=True, dtype_bytes=4)["total"]
    q = plan_run(Flags("ddp", bf16=True), 2, 16)  # autocast: fp32 residual stream, bf16 weight copies
    assert q["activations"] == activation_bytes(TINY_GPT, 8, flash=True, autocast=True)["total"]
    r = plan_run(Flags("fsdp2", bf16=True, ac=True), 2, 16)  # bf16 parameters; a CPU's LayerNorm keeps bf16 stats
    want = activation_bytes(TINY_GPT, 8, flash=True, recompute="full")["total"]
    assert r["activations"] == want - cpu_bf16_norm_stats(TINY_GPT, 8, ac=True) == want - 8 * 32 * 4
    assert plan_run(Flags("fsdp2", bf16=True, ac=True), 2, 16, device="cuda")["activations"] == want
    c = comm_elements(Flags("fsdp2", accum=2), 2)
    blocks, root = (sum(map(math.prod, u)) for u in fsdp_units())
    assert c == {"all_reduce": 0, "all_gather": 2 * (2 * blocks + root), "reduce_scatter": blocks + root,
                 "total": 5 * blocks + 3 * root}


def test_plan_equals_measured_on_3_processes_for_every_lever():
    # 3 ranks: 64 rows split 22/22/20, so the per-rank plan must follow FSDP2's uneven, padded chunks.
    configs = [Flags(), Flags("ddp", bf16=True), Flags("fsdp2"), Flags("fsdp2", bf16=True, ac=True, accum=2)]
    argv = [f.argv() + ["--steps", 2, "--warmup", 1, "--batch", 24, "--log-every", 2] for f in configs]
    results = launch(sweep, argv, num_processes=3, device="cpu", timeout=300, show_output=False)
    for rank, per_rank in enumerate(results):
        for flags, measured in zip(configs, per_rank):
            planned = plan_run(flags, 3, 24, rank=rank)
            assert [c for c in compare(planned, measured) if c["error"]] == [], (rank, str(flags))
            assert measured["comm_per_step"] == [planned["comm_elements"]] * 2  # the same traffic every step
    assert results[0][2]["parameters"] != results[2][2]["parameters"]  # uneven shards really happened
    torch.testing.assert_close(results[0][2]["losses"], results[0][0]["losses"], rtol=1e-5, atol=0)  # FSDP2 = DDP


def test_gpu_plan_for_the_running_example():
    psi = param_count(RUNNING_EXAMPLE)
    ddp = predict_gpu_run(RUNNING_EXAMPLE, 8, parallel="ddp", bf16=False)
    fsdp = predict_gpu_run(RUNNING_EXAMPLE, 8, parallel="fsdp2", bf16=True, ac=True)
    assert ddp["states"] == model_state_bytes(psi, "fp32")["total"] and not ddp["fits"]
    assert fsdp["states"] == model_state_bytes(psi, "fsdp2-mp", 8, 3)["total"] and fsdp["fits"]
    full = activation_bytes(RUNNING_EXAMPLE, 1, recompute="full")
    assert fsdp["activations"] == full["total"] + full["transient"]  # the peak: + one layer rebuilt in backward
    assert ddp["activations"] == activation_bytes(RUNNING_EXAMPLE, 1, dtype_bytes=4)["total"]
    auto = predict_gpu_run(RUNNING_EXAMPLE, 8, parallel="ddp")
    assert auto["activations"] == activation_bytes(RUNNING_EXAMPLE, 1, autocast=True)["total"]
    assert fsdp["memory"] == 80 * 2**30  # an "80 GB" H100 holds 80 GiB
    t = step_seconds(1e9, 1000, 1e12, hfu=0.5)
    assert t["compute"] == pytest.approx(6 * 1e9 * 1000 / 0.5e12) and t["mfu"] == pytest.approx(0.5)
    ac = step_seconds(1e9, 1000, 1e12, hfu=0.5, checkpointing=True)  # one more forward at the same HFU
    assert ac["compute"] == pytest.approx(4 / 3 * t["compute"]) and ac["mfu"] == pytest.approx(0.5 * 3 / 4)
    seven = step_seconds(RUNNING_EXAMPLE, 4096, 1e15, hfu=0.4)  # attention's 12·L·h·s: +15.9 % for the 7B at 4K
    assert seven["compute"] == pytest.approx(1.159 * 6 * psi * 4096 / 0.4e15, rel=1e-3)
    rows = lever_rows(RUNNING_EXAMPLE)
    assert [r["config"] for r in rows] == list(LEVER_CONFIGS)
    assert [r["fits"] for r in rows] == [False, False, False, True, True, True]  # bf16 params: 55 GB fits 80 GiB
    assert {"lever", "bottleneck", "saves", "costs", "source"} == set(lever_table()[0])
    with pytest.raises(ValueError, match="parallel"):
        predict_gpu_run(RUNNING_EXAMPLE, 8, parallel="zero9")
    with pytest.raises(ValueError, match="hfu"):
        step_seconds(1e9, 1e3, 1e15, hfu=0)


STEP_CASES = [["--parallel", "fsdp2", "--accum", 2, "--batch", 8, "--clip", 0.5], ["--parallel", "ddp", "--batch", 8]]


def _check_steps(got):
    """The script's step on 2 ranks (run in the assembled test's launch) against one process."""
    for argv, *per_rank in zip(STEP_CASES, *got):
        ref = single_process_step(*argv, world_size=2)
        for r in per_rank:
            assert r["error"] is None and r["syncs"] == r["ref_syncs"] > 0
            assert r["loss"] == r["ref_loss"] and r["norm"] == r["ref_norm"]  # the same operations, bit for bit
            assert r["loss"] == pytest.approx(ref["loss"], rel=1e-6) and r["norm"] == pytest.approx(ref["norm"], rel=1e-5)
            torch.testing.assert_close(r["grads"], ref["grads"], rtol=1e-4, atol=1e-6)
        assert per_rank[0]["syncs"] == (5 if argv[1] == "fsdp2" else 1)  # FSDP2: 4 blocks + the root


def test_a_ddp_run_with_bf16_needs_autocast():
    with pytest.raises(ValueError, match="--bf16 needs --parallel fsdp2"):
        CapstoneRun("--parallel", "ddp", "--bf16")


def _as_a_learner_builds(args, device, world):  # the build hook, fed the script's own pieces
    script = script_module()
    model = script.build_model(args, device, world)
    return (model, *script.build_optimizer(args, model, device), None)


def _assembled(argv, folder):
    """One launch, beside the script's build trial of exercise 11.2 (paired_launch's reference, first): the trial of
    exercise 11.3 on the script's pieces and loop, the script itself, the trial of 11.2 through the build hook, and
    the script's step against one process (exercise 11.1's reference)."""
    loop = capstone_trial(None, reference_step, reference_loop, argv, folder, signal_at=1)
    return loop, run_train(*argv), build_trial(_as_a_learner_builds, [argv]), step_trial(reference_step, STEP_CASES)


def test_the_assembled_run_resumes_bit_for_bit_like_the_script_and_its_build_is_counted_exactly(tmp_path, monkeypatch):
    flags = Flags("fsdp2", bf16=True, ac=True, accum=2)
    argv = flags.argv() + ["--batch", 8, "--steps", 4, "--warmup", 1, "--ckpt-every", 2, "--timeout", 30]
    got = paired_launch(_assembled, argv, str(tmp_path), reference=[argv], num_processes=2, timeout=240,
                        show_output=False)
    monkeypatch.setattr("m11_helpers.launch.launch", lambda *a, **k: pytest.fail("the reference launched again"))
    reference = reference_build([argv], 2)  # measured in the same ranks, before the rest: from the cache
    for rank, ((loop, script, (hooked,), _), (ours,)) in enumerate(zip(got, reference)):
        first, second = loop["phases"]
        assert loop["error"] is None and loop["world"] == 2
        assert first["returned"] == 2 and 2 in first["complete"]  # the agreed stop, saved
        assert second["steps"] == [2, 3] and second["returned"] == 4 and 4 in second["complete"]
        assert first["losses"] + second["losses"] == loop["straight"]["losses"] == script["losses"]  # bit for bit
        assert ours["losses"] == hooked["losses"] == script["losses"]
        planned = plan_run(flags, 2, 8, rank=rank)
        for measured in (ours, hooked):
            assert [c for c in compare(planned, measured) if c["error"]] == [], rank  # exact, as the sweep
            assert measured["comm_per_step"] == [planned["comm_elements"]] * 4
        assert (ours["weights"] is None) == (rank != 0) and ours["checkpointer"] == "NoneType"
    assert got[0][0]["phases"][1]["checksum"] == got[0][0]["straight"]["checksum"] == got[0][1]["checksum"]
    torch.testing.assert_close(reference[0][0]["weights"], got[0][2][0]["weights"], rtol=0, atol=0)
    _check_steps([r[3] for r in got])


def test_measured_levers_run_each_configuration_once_and_hold_the_plan(monkeypatch):
    configs = [Flags("fsdp2", ac=True), Flags("fsdp2", bf16=True), Flags(accum=4)]  # the last twice: measured once
    held = measured_levers(configs + [Flags(accum=4)], 2, 16)
    assert list(held) == [str(f) for f in configs]
    for f in configs:
        p = plan_run(f, 2, 16)
        assert held[str(f)]["held"] == p["total"] and held[str(f)]["comm_elements"] == p["comm_elements"]
    monkeypatch.setattr("m11_helpers.launch.launch", lambda *a, **k: pytest.fail("measured again"))
    assert measured_levers(configs[:1], 2, 16) == {str(configs[0]): held[str(configs[0])]}  # from the cache
    assert measured_levers([Flags(accum=4)], 3, 16) == {}  # 16 rows do not split into 3 × 4: not run


def test_the_command_is_read_as_accelerate_reads_it_and_functions_cross_processes_by_value(tmp_path, monkeypatch):
    from m11_helpers.capstone_command import REFERENCE_ENV, capstone_flags, freeze, read_command, run_command, thaw

    config = tmp_path / "c.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n"
                      "num_machines: 1\nmixed_precision: 'no'\nuse_cpu: false\n")
    script = ["capstone.py", "--run", "r.pkl", "--bf16", "--ac-every", "2", "--ckpt-dir", "d"]
    cmd = read_command(["accelerate", "launch", "--config_file", config, *script])
    assert (cmd.processes, cmd.one_process_why, cmd.script, cmd.mixed_precision) == (4, "", "capstone.py", "no")
    assert cmd.launcher == ["--config_file", str(config)] and cmd.flags == script[1:]
    assert read_command(["accelerate", "launch", "--config_file", config, "--num_processes", 2, *script]).processes == 2
    assert "ONE process" in read_command(["accelerate", "launch", "--cpu", "--num_processes", 4, *script]).one_process_why
    assert "MULTI_GPU" in read_command(["accelerate", "launch", "--num_processes", 4, *script]).one_process_why
    with pytest.raises(ValueError, match="accelerate launch refuses"):
        read_command(["accelerate", "launch", "--num_processes"])
    with pytest.raises(ValueError, match="argv must start"):
        read_command(["torchrun", "x.py"])
    run, args, flags = capstone_flags(cmd.flags)
    assert (run, args.bf16, args.ac_every, args.ckpt_dir, flags) == ("r.pkl", True, 2, "d", ["--bf16", "--ac-every", "2"])
    with pytest.raises(ValueError, match="refuses its flags"):
        capstone_flags(["--steps", "two"])
    with pytest.raises(ValueError, match="--dropout must be a number in"):
        capstone_flags(["--dropout", "2"])
    scale = 3
    code = compile("def f(x, k=2):\n    return [math.prod((x, k, scale)) for _ in range(1)]\n", "<cell>", "exec")
    cell = {"__name__": "__main__", "math": math, "scale": scale}
    exec(code, cell)  # a function defined in a notebook's __main__: pickle alone would look it up by name
    thawed = thaw(freeze({"f": cell["f"], "n": 1}, tmp_path / "run.pkl"))
    assert thawed["f"](5) == [30] and thawed["n"] == 1 and thawed["f"].__globals__["math"] is math
    seen = []  # what run_command hands launch_script (the real launch: exercise 11.3's check, tests/test_wrong_answers)
    monkeypatch.setattr("m11_helpers.launch.launch_script", lambda *a, **k: seen.append((a, k)))
    run_command(["accelerate", "launch", "--config_file", config, *script], reference=["--steps", 1], env={"A": "1"})
    (args, kw), = seen
    assert args[1:] == tuple(script[1:]) and (kw["num_processes"], kw["launcher_flags"]) == (4, cmd.launcher)
    assert kw["env"] == {"A": "1", REFERENCE_ENV: "--steps 1"}  # scripts/capstone.py trains the script's pieces first


def test_dropout_draws_masks_only_when_asked():
    from m11_helpers.models import TinyGPT

    x = torch.randint(0, TINY_GPT.vocab_size, (2, 8))
    plain, dropped = TinyGPT(TINY_GPT), TinyGPT(TINY_GPT, dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    state = torch.get_rng_state()
    out = plain(x)
    assert torch.equal(torch.get_rng_state(), state)  # p = 0: no random number drawn, the course's model unchanged
    assert not torch.equal(dropped(x), out) and not torch.equal(torch.get_rng_state(), state)
    assert torch.equal(dropped.eval()(x), out)  # eval: no dropout
    with pytest.raises(ValueError, match="dropout"):
        TinyGPT(TINY_GPT, dropout=1.5)
