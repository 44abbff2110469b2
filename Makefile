# The two set-up commands of the README:
#   make lab     — set up (once) and open the course in JupyterLab
#   make test    — set up (once) and run the whole test suite, as CI does
# and for contributors:
#   make test-lesson N=05   — one lesson's tests, notebook, grading and wrong answers (about a minute)
#   make course             — execute every course notebook, print each one's time, build the slides
#   make site               — the course website in build/site/ (executes every lesson first; EXECUTED=DIR reuses)
#
# Set-up (m11_helpers/tools/setup_venv.py) creates .venv when missing and prints each step with its time;
# uv when it is on PATH, else pip. TORCH_SPEC picks the torch version (default: the tested pin). The build
# follows the machine (TORCH_BUILD=auto): PyPI's CUDA build where there is an NVIDIA GPU (nvidia-smi, or
# /proc/driver/nvidia), else the CPU build (a CPU wheel already in pip's find-links, else PyTorch's CPU
# index) rather than PyPI's several GB of CUDA wheels; TORCH_BUILD=cpu or cuda says which. TORCH_INDEX
# takes torch alone from that index (then the course from pip's index):
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   make setup                — the set-up alone (the dev container's post-create command)
# The test suite is the CPU suite, on any machine: it hides the GPUs (CUDA_VISIBLE_DEVICES=), so every
# launch(device="auto") in it runs on CPU with gloo. On a GPU box the GPU paths are `make gpu-check`.
# npm is optional: without it set-up skips the offline slide assets (`m11 slides --cdn` still works).

PYTHON      ?= python3
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_BUILD ?= auto
VENV        := .venv
BIN         := $(VENV)/bin
STAMP       := $(VENV)/.m11-installed
PYTEST      := CUDA_VISIBLE_DEVICES= M11_STRICT=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest
# pytest-xdist workers: each test file (the course notebooks with the browser tests as one; the wrong-answer
# runs one per lesson) runs whole on one worker (tests/conftest.py). 3 on a 2-core laptop or CI runner: tests
# wait (timeouts, signals, a browser) for a fifth of their time, and a third worker fills it (2 cores, same
# run: 3 workers 630 s, 2 workers 724 s; a fourth gains nothing: 647 s against 644 s). JOBS=1 runs
# everything in one process.
JOBS        ?= 3
XDIST       := $(if $(filter-out 1,$(JOBS)),-n $(JOBS))

.PHONY: setup lab course site test test-lesson lint exercises slides clean-notebooks doctor gpu-check

$(STAMP): pyproject.toml m11_helpers/tools/setup_venv.py
	$(PYTHON) m11_helpers/tools/setup_venv.py --venv $(VENV) --extras lab,dev --torch-spec "$(TORCH_SPEC)" --torch-index "$(TORCH_INDEX)" --torch-build "$(TORCH_BUILD)"
# offline slide assets (reveal.js, MathJax) need npm once; without npm this says so and set-up goes on
	$(BIN)/python -m m11_helpers.tools.assets --optional
# matplotlib's font cache, built now rather than during the first lesson's (or browser test's) first plot
	$(BIN)/python -c "import matplotlib.font_manager"
# the grading sandbox (bubblewrap, Linux), from the OS's packages where we may; else `m11 grade` warns it is unisolated
	@command -v bwrap >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && $$([ "$$(id -u)" = 0 ] || echo sudo -n) apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1; } || echo "(no bubblewrap: graded notebooks run unisolated, with a warning; Debian/Ubuntu: sudo apt-get install bubblewrap)"
	touch $@

setup: $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab course/

course: $(STAMP)
	$(BIN)/m11 course

# the website (m11_helpers/tools/course_site.py) is built from executed notebooks: `m11 course` writes them to
# build/executed/ (about 10 min on 2 cores); EXECUTED=DIR builds from a folder that already has them
site: $(STAMP)
	$(if $(EXECUTED),,$(BIN)/m11 course --no-slides)
	$(BIN)/m11 site --executed "$(or $(EXECUTED),build/executed)"

lint: $(STAMP)
	$(BIN)/ruff check .

# the course notebooks run from copies, with the package from a wheel: tests/conftest.py collects them
test: $(STAMP)
	$(BIN)/ruff check .
	$(PYTEST) $(XDIST) --durations=10 --nbval-lax tests

test-lesson: $(STAMP)
	@test -n "$(N)" || (echo "usage: make test-lesson N=05" && exit 2)
	eval $(PYTEST) $(XDIST) $$($(BIN)/python tests/support/lesson_tests.py $(N))

exercises: $(STAMP)
	$(BIN)/m11 make-exercises

slides: $(STAMP)
	$(BIN)/m11 slides

clean-notebooks: $(STAMP)
	$(BIN)/m11 nbclean course solutions exercises

doctor: $(STAMP)
	$(BIN)/m11 doctor

gpu-check: $(STAMP)
	$(BIN)/m11 gpu-check
