# The two set-up commands of the README:
#   make lab    — set up (once) and open the course in JupyterLab
#   make test   — set up (once) and run the whole test suite, as CI does
# and a headless run of the course:
#   make course — execute every course notebook, print each one's time, build the slides into build/
#
# Set-up creates .venv when missing. TORCH_SPEC picks the torch build: the default pin matches the
# CPU wheel on this project's machines; on a GPU box use e.g. `make test TORCH_SPEC=torch`.

PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV       := .venv
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.m11-installed

.PHONY: lab course test exercises slides clean-notebooks doctor

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m m11_helpers.assets
	touch $@

lab: $(STAMP)
	$(BIN)/jupyter lab course/

course: $(STAMP)
	$(BIN)/m11 course

test: $(STAMP)
	M11_STRICT=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest --nbval-lax tests course

exercises: $(STAMP)
	$(BIN)/m11 make-exercises

slides: $(STAMP)
	$(BIN)/m11 slides

doctor: $(STAMP)
	$(BIN)/m11 doctor
