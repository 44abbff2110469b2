"""The tamper guard around each check cell: who drives it, and the code it sends into the kernel.

Used by the engine's pytest plugin only (and its tests and benchmarks/guard_cost.py). `driver`
runs in the grading process and may import the standard library and nothing of the course but
`grading.cells` (the check names); it reads `kernel.py` and `ledger.py` as text and sends them
into the graded kernel, where they import nothing of the course at all (they find the check-cell
API in `sys.modules`). What it verifies is derived in `driver.VERIFIED`: the check-cell API and
every module of `m11_helpers.launch`, with the course modules they import.
"""
