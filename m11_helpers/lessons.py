"""The lesson table as data (kit): each lesson's room — its modules, quiz, notebooks, wrong answers, tests, deck.

    lesson("04").modules          # ('pipeline', 'pipeline_run', …): m11_helpers.<name>
    lesson("04").places()         # {'course': 'course/04_model_parallel.ipynb', 'quiz': 'm11_helpers/quizzes/…', …}
    owner("tensor_parallel_run")  # '04_model_parallel': the row a module belongs to
    markdown_table()              # CONTRIBUTING.md's lesson table, generated from ROWS

One lesson is one name in every folder: `NN_topic` gives course/, solutions/, exercises/,
solutions/wrong_answers/, quizzes/qNN_topic.py and the deck build/slides/NN_topic.slides.html, so a
row records only what the name cannot give: its modules and its test files. The rows after the
lessons (kit, tools, whole course) place every other module and test. `tests/test_contract.py` checks
this table against the files on disk, `make test-lesson` and `m11 where NN` read it, and
`m11 new-lesson` adds a row (one line, before the `# lessons: end` marker). Data and small accessors only:
it imports nothing of the package but `validate`.
"""

from __future__ import annotations

import dataclasses

from m11_helpers.validate import one_of

__all__ = ["Row", "Lesson", "LESSONS", "ROWS", "lesson", "owner", "markdown_table"]


@dataclasses.dataclass(frozen=True)
class Row:
    """A row of the table: a name, the modules of m11_helpers it owns (dotted, top level) and its test files."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Lesson(Row):
    """A lesson's row; `name` is its stem, NN_topic."""

    @property
    def number(self) -> str:
        return self.name[:2]

    @property
    def topic(self) -> str:
        return self.name[3:]

    def places(self) -> dict[str, str]:
        """Every file of the lesson's room, relative to the repository root, by role."""
        s = self.name
        return {"course": f"course/{s}.ipynb", "solution": f"solutions/{s}.ipynb", "exercise": f"exercises/{s}.ipynb",
                "wrong_answers": f"solutions/wrong_answers/{s}.py", "quiz": f"m11_helpers/quizzes/q{s}.py",
                "deck": f"build/slides/{s}.slides.html"}


def _l(name: str, modules: str, tests: str) -> Lesson:
    return Lesson(name, tuple(modules.split()), tuple(f"test_{t}.py" for t in tests.split()))


LESSONS: tuple[Lesson, ...] = (
    _l("00_welcome", "welcome", "welcome"),
    _l("01_hardware", "hardware hardware_specs roofline compute_budget", "hardware"),
    _l("02_collectives", "collectives comm_model collectives_plots critical_path", "collectives"),
    _l("03_data_parallel", "data_parallel ddp_overlap ddp_buckets", "data_parallel"),
    _l("04_model_parallel", "pipeline pipeline_run pipeline_comm tensor_parallel tensor_parallel_run planner overlap "
       "pipeline_zb pipeline_ticks backward_split", "pipeline tensor_parallel planner overlap pipeline_zb"),
    _l("05_zero_fsdp", "zero zero_lab zero_optimizer zero_resume fsdp live_memory fsdp_prefetch fsdp2_knobs sharded_muon "
       "gather_watch",
       "zero fsdp fsdp_prefetch fsdp2_knobs sharded_muon"),
    _l("06_mixed_precision", "number_formats loss_scaling master_weights autocast_ops held_memory precision_speed "
       "clipping nan_hunter fp8_scaling fp8_lab", "mixed_precision loss_scaling clipping fp8_scaling"),
    _l("07_gradient_accumulation", "gradient_accumulation accumulation_step accumulation_limits",
       "gradient_accumulation accumulation_step"),
    _l("08_activation_checkpointing", "activation_checkpointing activation_costs selective_checkpointing "
       "activation_offload", "activation_checkpointing activation_offload"),
    _l("09_efficiency", "attention op_trace fusion profiling flash_backward flex_masks",
       "attention fusion profiling flash_backward"),
    _l("10_cloud_spot", "cloud cloud_launch fault_tolerance sharded_checkpoint spike_guard lr_schedule meta_init "
       "throughput reference_run live_replica live_recovery restart_drill diloco dcp_drill dcp_judge",
       "cloud fault_tolerance sharded_checkpoint spike_guard train_script elastic_restart live_recovery diloco "
       "dcp_drill"),
    _l("11_capstone", "capstone_plan capstone_gpu capstone_measure capstone_build capstone_assembly capstone_command",
       "capstone"),
    _l("12_long_context_moe", "sequence_parallel context_parallel expert_parallel hsdp planner5d long_context_runs "
       "ulysses moe_balance", "sequence_parallel context_parallel expert_parallel hsdp planner5d long_context_runs "
       "ulysses moe_balance"),
)  # lessons: end

ROWS: tuple[Row, ...] = LESSONS + (
    Row("kit", ("launch", "procs", "tether", "validate", "timing", "display", "resources", "environment", "models",
                "data", "config", "quiz", "quizzes", "memory", "model_states", "activations", "quantities",
                "lessons", "comm_count", "compare", "device_check", "device_lint", "device_state"),
        ("test_launch.py", "test_kit.py", "test_memory.py", "test_quizzes.py", "test_model_states.py",
         "test_activations.py", "test_quantities.py", "test_launch_cleanup.py", "test_comm_count.py",
         "test_device_proof.py")),
    Row("tools", ("tools", "grading"),
        ("test_notebooks.py", "test_slides.py", "test_browser.py", "test_cli.py", "test_gpu_check.py",
         "test_new_lesson.py", "test_packaging.py", "test_version_floors.py", "test_grading.py", "test_observe.py",
         "test_sandbox.py", "test_instructor_ci.py", "test_student_repo.py", "test_site.py",
         "test_devcontainer.py")),
    Row("whole course", (),
        ("test_repo.py", "test_contract.py", "test_course_notebooks.py", "test_lessons_graded.py",
         "test_wrong_answers.py")),
)


def lesson(number: str) -> Lesson:
    """The lesson numbered `number` ('04'); ValueError naming the numbers there are."""
    one_of("number", number, [r.number for r in LESSONS])
    return next(r for r in LESSONS if r.number == number)


def owner(module: str, rows: tuple[Row, ...] = ROWS) -> list[str]:
    """The rows that own `module` (dotted, relative to m11_helpers): by its top-level name; exactly one when sound."""
    return [r.name for r in rows if module.split(".")[0] in r.modules]


def markdown_table(rows: tuple[Row, ...] = ROWS) -> str:
    """CONTRIBUTING.md's lesson table (between its lesson-table markers), one line per row."""
    def cell(names: tuple[str, ...]) -> str:
        return ", ".join(f"`{n}`" for n in names) or "—"

    lines = ["| Lesson | Modules (`m11_helpers.…`) | Tests (`tests/…`) |", "|---|---|---|"]
    return "\n".join(lines + [f"| {r.name} | {cell(r.modules)} | {cell(r.tests)} |" for r in rows])
