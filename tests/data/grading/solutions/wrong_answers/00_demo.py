"""Recorded wrong answers for the grader fixture 00_demo (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 0.1 | divides by a fixed 3 | expect: mean([5])
def mean(xs):
    return sum(xs) / 3

# %% 0.1 | returns the sum | expect: sum, then divide
def mean(xs):
    return sum(xs)

# %% 0.2 | sums instead of averaging | expect: divide by the world size
def average_over_ranks(grads, world_size):
    return [sum(g) for g in zip(*grads)]

# %% 0.2 | averages over a fixed 2 ranks | expect: avg over 3 ranks
def average_over_ranks(grads, world_size):
    return [sum(g) / 2 for g in zip(*grads)]
