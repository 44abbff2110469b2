"""The tamper guard around each check cell: who drives it, and the code it sends into the kernel.

Used by the engine's pytest plugin only (and its tests and benchmarks/guard_cost.py). `driver` runs
in the grading process and imports the standard library and `quiet` (has the kernel stopped
answering?) only; it reads `kernel.py` and `ledger.py` as text and sends them into the graded
kernel, where they import nothing of the course at all (they find the check-cell API in
`sys.modules`). What it verifies is derived in `driver.VERIFIED`: every module at grading's top
level (the check-cell API) and of `m11_helpers.launch`, with the course modules they import.
"""
