"""The course's one quiz widget: multiple choice, feedback per answer, a running score.

    quiz("03_data_parallel")          # the lesson's questions, from m11_helpers/quizzes/q03_data_parallel.py

A lesson's questions live in `m11_helpers/quizzes/qNN_topic.py` as `QUESTIONS = [Question(...), ...]`,
not in the notebook, so the answer index is not on the learner's screen (or slide)::

    Question("You double the ranks at a fixed per-rank batch. The all-reduce's bytes per rank…",
             ["halve", "stay about the same", "double"], answer=1,
             feedback=["…", "Right: 2(N−1)/N of the gradient, almost independent of N.", "…"],
             transfer=True)

`transfer=True` marks a question that puts the lesson's idea in a situation the lesson did not compute
(another model, cluster, precision, world size, failure), its answer derived in the right option's feedback;
at least half of every quiz, and none whose right answer is a number the lesson prints (tests/test_quizzes.py).

The scoring is `QuizState` (plain Python, tested); the widget only wires buttons to it. Without a
live widget front end (a static export, a slide deck), the quiz also renders as Markdown.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Question:
    prompt: str
    options: list[str]
    answer: int  # index of the right option
    feedback: list[str]  # one explanation per option, shown when it is picked
    transfer: bool = False  # "you change X: what happens to Y?" rather than recall

    def __post_init__(self) -> None:
        if len(self.options) < 2:
            raise ValueError(f"options must have at least 2 entries, got {len(self.options)}")
        if not 0 <= self.answer < len(self.options):
            raise ValueError(f"answer must be an index in 0..{len(self.options) - 1}, got {self.answer}")
        if len(self.feedback) != len(self.options):
            raise ValueError(f"feedback must have one entry per option ({len(self.options)}), got {len(self.feedback)}")


class QuizState:
    """Scores first attempts: a question counts as right only if the first pick was right."""

    def __init__(self, questions: list[Question]):
        if not questions:
            raise ValueError("questions must not be empty")
        self.questions = list(questions)
        self.first_pick: dict[int, int] = {}

    def pick(self, q: int, option: int) -> tuple[bool, str]:
        if not 0 <= q < len(self.questions):
            raise ValueError(f"q must be in 0..{len(self.questions) - 1}, got {q}")
        question = self.questions[q]
        if not 0 <= option < len(question.options):
            raise ValueError(f"option must be in 0..{len(question.options) - 1}, got {option}")
        self.first_pick.setdefault(q, option)
        return option == question.answer, question.feedback[option]

    @property
    def score(self) -> int:
        return sum(self.questions[q].answer == o for q, o in self.first_pick.items())

    def score_line(self) -> str:
        return f"Score: {self.score} / {len(self.questions)} (answered {len(self.first_pick)})"


def as_markdown(questions: list[Question]) -> str:
    """The quiz as text, answers folded away, for slides and static exports."""
    parts = []
    for i, q in enumerate(questions, 1):
        opts = "\n".join(f"{chr(65 + j)}. {o}" for j, o in enumerate(q.options))
        parts.append(f"**Q{i}. {q.prompt}**\n\n{opts}\n\n<details><summary>Answer</summary>"
                     f"{chr(65 + q.answer)}: {q.feedback[q.answer]}</details>")
    return "\n\n".join(parts)


class Quiz:
    """The widget. Display it as the last expression of a cell, or call `quiz(questions)`."""

    def __init__(self, questions: list[Question]):
        self.state = QuizState(questions)

    def _repr_markdown_(self) -> str:
        return as_markdown(self.state.questions)

    def widget(self):
        import ipywidgets as w

        score = w.HTML(f"<b>{self.state.score_line()}</b>")
        boxes = []
        for qi, q in enumerate(self.state.questions):
            out = w.HTML("")
            buttons = [w.Button(description=f"{chr(65 + j)}. {o}", layout=w.Layout(width="auto"))
                       for j, o in enumerate(q.options)]

            def on_click(button, qi=qi, j=None, out=out, buttons=buttons):
                j = buttons.index(button)
                right, text = self.state.pick(qi, j)
                button.button_style = "success" if right else "danger"
                out.value = f"{'✔' if right else '✘'} {text}"
                score.value = f"<b>{self.state.score_line()}</b>"

            for b in buttons:
                b.on_click(on_click)
            boxes.append(w.VBox([w.HTML(f"<b>Q{qi + 1}. {q.prompt}</b>"), *buttons, out]))
        return w.VBox([*boxes, score])

    def _ipython_display_(self) -> None:
        from IPython.display import Markdown, display

        try:
            display(self.widget())
        except ImportError:  # no ipywidgets: the static form still teaches
            display(Markdown(as_markdown(self.state.questions)))


def lesson_questions(lesson: str) -> list[Question]:
    """`QUESTIONS` of m11_helpers/quizzes/q<lesson>.py (e.g. "03_data_parallel": q03_data_parallel.py)."""
    import importlib

    try:
        module = importlib.import_module(f"m11_helpers.quizzes.q{lesson}")
    except ModuleNotFoundError:
        raise ValueError(f"lesson {lesson!r} has no quiz: expected m11_helpers/quizzes/q{lesson}.py") from None
    return list(module.QUESTIONS)


def quiz(questions: list[Question] | str) -> Quiz:
    """Show a quiz (a lesson name or questions); returns it so a test (or the curious) can inspect `.state`."""
    return Quiz(lesson_questions(questions) if isinstance(questions, str) else questions)
