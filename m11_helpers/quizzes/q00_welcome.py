"""Lesson 00 quiz: shown by `quiz("00_welcome")`."""

from m11_helpers.quiz import Question

QUESTIONS = [
    Question("`launch(fn, num_processes=4)` on a laptop without a GPU runs fn…",
             ["once, in the notebook", "in 4 threads of the kernel", "in 4 separate processes, talking over gloo",
              "in 4 processes that cannot communicate"], 2,
             ["That is what Accelerate's notebook_launcher does on Colab's CPU runtime; M11's launcher forks real processes.",
              "Threads would share one Python interpreter; collectives need separate ranks.",
              "Right: real processes, each with torch.distributed initialised on the gloo backend.",
              "They communicate: that is what the all-reduce showed."]),
    Question("Each of 4 ranks computes ∇Lᵢ on a quarter of the batch (Lᵢ a mean). To get the full-batch gradient you…",
             ["sum the ∇Lᵢ", "average the ∇Lᵢ (sum, then divide by 4)", "take rank 0's ∇L₀", "multiply by 4"], 1,
             ["The sum is 4× too large: the update would be 4× the intended step.",
              "Right: all-reduce gives the sum; divide by N.",
              "Rank 0 only saw a quarter of the data.",
              "That scales the error, not the gradient."]),
    Question("After all_reduce(x) with the default op, x on rank 3 of 4 holds…",
             ["its own value", "the sum over all ranks", "the value of rank 0", "nothing: only rank 0 gets the result"], 1,
             ["all_reduce changes x in place on every rank.",
              "Right: every rank ends with the same sum.",
              "That is broadcast.",
              "That is reduce (to one destination); all-reduce gives everyone the result."]),
    Question("One rank raises an exception while its peers wait in a barrier. With M11's launch you get…",
             ["a hang of 30 minutes (gloo's default timeout)", "a LaunchError naming that rank, within about a second",
              "a silent wrong result", "the kernel restarts"], 1,
             ["That is what a bare process group does; the launcher watches its ranks instead.",
              "Right: the failing rank's traceback, its peers stopped, no process left behind.",
              "A failed rank never returns a result.",
              "The ranks are separate processes; the kernel is untouched."]),
]
