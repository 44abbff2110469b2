"""Exercise 10.7's drill and verdicts (m11_helpers.dcp_drill, dcp_judge), on evidence made by hand: no ranks.

The real runs are the graded exercise itself (tests/test_lessons_graded.py) and its recorded wrong
answers (tests/test_wrong_answers.py); here each verdict is shown to name the mistake it is for, and to
pass the evidence of a right save, so a judge that cannot fail (or always fails) is caught in a second.
"""

import threading

import pytest
import torch

from m11_helpers import dcp_drill, dcp_judge
from m11_helpers.sharded_checkpoint import step_dir


def _right_run(folder, rank=0, gate="overlapped", publish_first=False, write_in=None):
    """The events a right save makes on `rank`: mkdir, data, metadata, rename, publish (rank 0), per save."""
    root, seq, events = folder.resolve(), iter(range(10_000)), []

    def ev(kind, detail, main=False):
        events.append((next(seq), kind, detail, main))

    for s in dcp_drill.SAVE_AT:
        tmp, final = str(step_dir(root, s)) + ".tmp", str(step_dir(root, s))
        ev("save_call", s, True)
        ev("mkdir", tmp)
        if publish_first and rank == 0:
            ev("rename", [tmp, final], True)
        ev("write", f"{write_in or tmp}/__{rank}_0.distcp")
        if rank == 0:
            ev("write", f"{tmp}/.metadata.tmp")
            ev("rename", [f"{tmp}/.metadata.tmp", f"{tmp}/.metadata"])
            if not publish_first:
                ev("rename", [tmp, final])
        ev("save_return", s, True)
    return {"events": events, "gates": [gate] if gate else [], "counted": 5 if rank == 0 else 0}


@pytest.mark.parametrize("mistake, expect", [
    ({}, None),
    ({"gate": "training thread"}, "synchronous save"),
    ({"gate": "no step began"}, "waited for the write"),
    ({"gate": None}, "cannot be resharded"),
    ({"publish_first": True}, "published only after its write finished"),
    ({"write_in": "LATEST"}, "inside a fresh step_N.tmp/"),
])
def test_save_problems_name_each_mistake_and_pass_a_right_save(tmp_path, mistake, expect):
    kw = dict(mistake)
    if kw.get("write_in"):
        kw["write_in"] = str(tmp_path.resolve() / "step_latest")
    outs = [_right_run(tmp_path, r, **kw) for r in range(2)]
    problems = dcp_judge.save_problems(outs, tmp_path, dcp_drill.SAVE_AT)
    if expect is None:
        assert problems == []
    else:
        assert problems and expect in " ".join(problems[0]), problems


def test_kill_expectation_keeps_the_last_published_step(tmp_path):
    rank0 = _right_run(tmp_path)  # the last save's ops: mkdir, data, .metadata.tmp, .metadata, publish
    got = [dcp_judge.kill_expectation(rank0, k, tmp_path, dcp_drill.SAVE_AT) for k in range(6)]
    assert got == [2, 2, 2, 2, 2, 4]  # killed before the publish: the previous one; after it: the new one


def test_resume_problems_name_the_step_the_weights_the_moments_and_the_gap():
    ref = {"w": torch.zeros(3)}
    right = {"step": 2, "model_diff": [], "optim_diff": [], "final": {"w": torch.full((3,), 1e-6)}}
    case = [("a killed run", 2)]
    assert dcp_judge.resume_problems([right], case, ref, 3) == []
    for out, expect in [({**right, "step": 4}, "step_N.tmp"), ({**right, "step": 1}, "the next step to run"),
                        ({**right, "model_diff": ["model.0.weight"]}, "weights loaded on 3 ranks"),
                        ({**right, "optim_diff": ["optim.state"]}, "AdamW's state loaded"),
                        ({**right, "final": {"w": torch.ones(3)}}, "within 0.0001")]:
        problems = dcp_judge.resume_problems([out], case, ref, 3)
        assert problems and expect in " ".join(problems[0]), (out, problems)
    assert dcp_judge.resume_problems([{"step": None}], [("an empty folder", None)], ref, 3) == []


def test_the_probe_sees_a_write_on_the_training_thread_and_a_write_no_step_overlaps(tmp_path, monkeypatch):
    monkeypatch.setattr(dcp_drill, "GRACE_S", 0.05)
    probe = dcp_drill._Probe(tmp_path, rank=1, kill_at=None)
    probe.arm(gate=True, count=False)
    probe.hook("open", (str(tmp_path / "step_00000002.tmp" / "__1_0.distcp"), "wb", 0))
    probe.hook("open", (str(tmp_path.parent / "elsewhere.distcp"), "wb", 0))  # outside the folder: not seen
    probe.arm(gate=True, count=False)
    writer = threading.Thread(target=probe.hook, args=("open", (str(tmp_path / "x.tmp" / "__1_0.distcp"), "wb", 0)))
    writer.start()
    writer.join()
    assert probe.gates == ["training thread", "no step began"]
    assert [e[1] for e in probe.events] == ["write", "write"]
