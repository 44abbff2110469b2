"""Lesson 00 quiz: shown by `quiz("00_welcome")`. The course asks "divide by N after the all-reduce" here only."""

from m11_helpers.quiz import Question

QUESTIONS = [
    Question("After `all_reduce(x)` with the default op, what does x hold on rank 3 of 4?",
             ["its own value", "the sum over all ranks", "the value of rank 0", "nothing: only rank 0 gets the result"], 1,
             ["all_reduce changes x in place on every rank.",
              "Right: every rank ends with the same sum (and its own value is gone: reduce a clone if you need it).",
              "That is broadcast.",
              "That is reduce (to one destination); all-reduce gives everyone the result."]),
    Question("Each of 4 ranks computes ∇Lᵢ on a quarter of the batch (Lᵢ a mean). To get the full-batch gradient you…",
             ["sum the ∇Lᵢ", "average the ∇Lᵢ (all-reduce, then divide by 4)", "take rank 0's ∇L₀", "multiply by 4"], 1,
             ["The sum is 4× too large: the update would be 4× the intended step.",
              "Right: all-reduce gives the sum; divide by N.",
              "Rank 0 only saw a quarter of the data.",
              "That scales the error, not the gradient."]),
    Question("You switch every rank's loss from the mean to the SUM over its shard (`reduction='sum'`) and want the "
             "gradient of the summed loss over the whole batch. After the all-reduce you…",
             ["divide by N, as before", "divide by the batch size", "do nothing: the sum of the ranks' sums is the "
              "whole batch's sum", "multiply by N"], 2,
             ["÷N undoes a mean over ranks; here nothing was averaged, so ÷N would shrink the gradient N times.",
              "That gives the gradient of the mean loss, not of the summed loss asked for.",
              "Right: sums add up across shards (even uneven ones), so the all-reduce alone is exact.",
              "The all-reduce already added the N contributions once."], transfer=True),
    Question("You go from 4 to 8 ranks and keep 16 samples per rank. What is the gradient after all-reduce and ÷N?",
             ["the same as with 4 ranks", "the gradient of the mean loss over 128 samples: a larger batch, less noisy",
              "twice as large", "half as large"], 1,
             ["The ranks now see 128 samples, not 64: a different batch, a different gradient.",
              "Right: the global batch doubles. Its scale is unchanged (it is still a mean), its noise drops; the "
              "learning rate that worked for 64 may need retuning.",
              "÷N with N = 8 keeps it a mean: the scale does not grow with the ranks.",
              "Still a mean over all samples: the scale does not shrink either."], transfer=True),
    Question("On a cluster, one rank of 64 dies (out of memory) just before an all-reduce. Without any watchdog, "
             "what do the other 63 ranks do?",
             ["they finish the step without it", "they wait inside the all-reduce until the process group's timeout "
              "(minutes) or a broken connection", "they restart the dead rank", "they skip the all-reduce"], 1,
             ["A collective needs every rank of the group: nobody can finish it alone.",
              "Right: a collective blocks until every rank joins. That is why launchers (torchrun, this course's "
              "launch) watch the processes and stop the job as soon as one fails.",
              "Nothing in torch.distributed restarts a rank by itself; torchrun's elastic agent can restart the whole "
              "group.",
              "The others cannot know: they are already waiting inside it."], transfer=True),
]
