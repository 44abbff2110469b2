"""What `m11 grade` produces: a score per exercise, per notebook. Plain data, shared by the grader and the reports."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ExerciseResult", "NotebookResult"]


@dataclass
class ExerciseResult:
    exercise: str
    points: float
    max_points: float
    status: str  # passed | failed | not run
    why: str = ""
    tampering: list[str] = field(default_factory=list)  # what the guard caught (the exercise scored 0)


@dataclass
class NotebookResult:
    notebook: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(e.max_points for e in self.exercises)
