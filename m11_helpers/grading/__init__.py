"""Graded exercises: checks learners call, exercise generation, the autograder."""
