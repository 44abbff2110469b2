"""Each lesson's quiz questions, `q<NN_topic>.py` holding `QUESTIONS`: shown by `m11_helpers.quiz.quiz("NN_topic")`.

Kept out of the notebooks so the answer index is not on the learner's screen. A module name cannot
start with a digit, hence the `q` prefix.
"""
