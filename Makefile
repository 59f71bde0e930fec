# The two commands of the README. Each creates .venv when missing, installs a CPU torch where none is
# installed (never a multi-GB CUDA build), then the project with its test extras, then runs.
PYTHON ?= python3
VENV ?= .venv
# A CPU build of torch. On this project's machines pip finds the local wheel; elsewhere point pip at the
# CPU index, e.g. make TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" gate
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
OUT ?= h3-out
PYTEST_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The Triton an H200 runs the kernels with (the Gluon ones are written against it), beside the suite's own: the CPU
# suite compiles them for sm_90 with it too (tests/kernels/sm90.py); only its compiler is used.
H200_TRITON ?= triton==3.6.0
H200_TRITON_STAMP := $(VENV)/triton-3.6/.installed

.PHONY: gate test setup clean

setup: $(STAMP) $(H200_TRITON_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[test]"
	touch $@

$(H200_TRITON_STAMP): | $(STAMP)
	$(BIN)/python -m pip install --no-deps --target $(dir $@) "$(H200_TRITON)"
	touch $@

# The evidence of `make gate` is signed with a throwaway key made here once (pass SIGN_KEY=... for a real one).
THROWAWAY_KEY := $(OUT)/throwaway-key/h3gate-signing-key.pem
SIGN_KEY ?= $(THROWAWAY_KEY)

$(THROWAWAY_KEY): | $(STAMP)
	$(BIN)/h3gate keygen $(dir $@)
	@echo "make gate: signing with a THROWAWAY key generated in $(dir $@) (not a key anyone trusts)"

# The gate suite on the embedded tiny model, on CPU under Triton's interpreter, then the model and block gates on
# the edge preset (tiny at the kernels' edges: widths that are not powers of two, batch 2, a one-row last tile):
# evidence and JUnit in $(OUT) and $(OUT)/edge. xdist spreads each run's items over the CPU's cores.
GATE_RUN := TRITON_INTERPRET=1 $(BIN)/python -m pytest -m gate --h3-device=cpu --h3-sign-key=$(SIGN_KEY) -n auto
gate: $(STAMP) $(SIGN_KEY)
	$(GATE_RUN) tests/gates --h3-model=tiny --h3-out=$(OUT) --junitxml=$(OUT)/junit.xml $(PYTEST_ARGS)
	$(GATE_RUN) tests/gates/test_model.py tests/gates/test_block.py --h3-model=edge --h3-profile=model-block \
		--h3-out=$(OUT)/edge --junitxml=$(OUT)/edge/junit.xml $(PYTEST_ARGS)
	for run in $(OUT) $(OUT)/edge; do \
		$(BIN)/h3gate verify $$run/evidence.json --key $(SIGN_KEY:.pem=.pub.pem) --thresholds thresholds && \
		$(BIN)/h3gate report $$run/evidence.json -o $$run/report.md || exit 1; \
	done

# The whole CPU test suite. Its gate runs write to a new temporary folder: a test run never overwrites the
# signed evidence `make gate` left in $(OUT).
test: $(STAMP) $(H200_TRITON_STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest tests -n auto --h3-out="$$(mktemp -d -t h3-test-out.XXXXXX)" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
