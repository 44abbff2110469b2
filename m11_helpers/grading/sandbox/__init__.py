"""The isolation a graded notebook runs in: bubblewrap namespaces, limits, and the walls a report names.

Used by the engine (`isolate.popen` starts the nbval process) and by classroom and `m11 grade` to
say what isolated a run (`isolate.describe`). It may import `grading.runenv` and the kit's
`validate`, nothing else of the course: it knows processes and paths, not notebooks.
"""
