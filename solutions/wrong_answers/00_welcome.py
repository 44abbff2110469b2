"""Recorded wrong answers for solutions/00_welcome.ipynb (format: m11_helpers/grading/wrong_answers.py)."""

# %% 0.1 | forgets to divide by the world size | expect: divide by
def average(t: torch.Tensor) -> torch.Tensor:
    total = t.clone()
    dist.all_reduce(total)
    return total

# %% 0.1 | all-reduces the caller's tensor in place | expect: changed the caller's tensor
def average(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return t
