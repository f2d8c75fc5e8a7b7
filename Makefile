# grpo-lab: `make course` runs the whole course, `make test` runs every notebook once and then every test.
# Both create .venv and install the stack for this machine's hardware first (skipped when nothing
# changed). Override the detected hardware with STACK=cpu|cuda|npu.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STACK ?= $(shell \
  if command -v npu-smi >/dev/null 2>&1 || ls /dev/davinci[0-9]* >/dev/null 2>&1; then echo npu; \
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo cuda; \
  else echo cpu; fi)
STACK_FILE := grpo_lab/stacks/$(STACK).txt
STAMP := $(VENV)/.grpo-lab-installed-$(STACK)
ifeq ($(wildcard $(STACK_FILE)),)
$(error Unknown STACK=$(STACK): use cpu, cuda or npu (stack files are in grpo_lab/stacks/))
endif
RUN_DIR ?= runs/course
VERL_VERSION ?= 0.9.1
VERL_WHEEL := .cache/verl/verl-$(VERL_VERSION)-py3-none-any.whl
LAB_PORT ?= 8888
LAB_ARGS ?=

# Caches live in folders this checkout owns; nothing is fetched from a model hub for the tiny profile.
export HF_HOME ?= $(CURDIR)/.cache/huggingface
export VLLM_CACHE_ROOT ?= $(CURDIR)/.cache/vllm
export MPLCONFIGDIR ?= $(CURDIR)/.cache/matplotlib
export TOKENIZERS_PARALLELISM ?= false
# One thread per process: on a 2-core machine vLLM's engine, the trainer and the kernel compete otherwise
# (measured: tiny-model generation ran ~40x slower with 2 threads under load). Override if you have cores.
export OMP_NUM_THREADS ?= 1
# vllm-ascend: vLLM itself is installed without CUDA kernels (its documented install).
ifeq ($(STACK),npu)
export VLLM_TARGET_DEVICE ?= empty
endif

.PHONY: install browser course test lab env clean-venv

install: $(STAMP)

# The lab (benchmarks/lab, imported as `lab`) goes in editable beside the package, in the same call; `pip install .`
# of grpo_lab alone never installs it.
$(STAMP): pyproject.toml benchmarks/pyproject.toml $(STACK_FILE)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the '$(STACK)' stack into $(VENV) (constraints: $(STACK_FILE))"
	@start=$$(date +%s); \
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[$(STACK),notebooks,tracking,dev]" -e benchmarks \
	  -c $(STACK_FILE) 2>&1 | { grep -v "^WARNING: Location" || true; } && \
	if [ "$(STACK)" = cpu ]; then \
	  $(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null; true; \
	fi && \
	echo "Install took $$(( $$(date +%s) - start )) s"
	@rm -f $(VENV)/.grpo-lab-installed-*
	@touch $@

# Notebook 03 trains the profile's steps (tiny: 250 under a time guard, as in CI); GRPO_LAB_TRAIN_STEPS=N asks for
# another length. 600 tiny steps were tried here: the held-out gain ranged from none to large between runs.
course: install
	$(PY) -m grpo_lab.course --out $(RUN_DIR)

# The notebooks run once, as copies in $(EXECUTED_DIR) that keep their outputs (--overwrite), then
# tests/test_notebook_outputs.py reads those outputs (no warnings, no progress bars, a check at the end, ...). That runs
# in one pytest process, in order (04, 05 and 09 use the run 03 trained), while a second process runs the other tests:
# the two fill a 2-core machine (each process is single-threaded, OMP_NUM_THREADS=1; the CPU was 99 % busy throughout).
# BESIDE_NOTEBOOKS evens them out (measured on 2 cores in a fresh clone on 2026-12-07 at b5b8076, make test 897 s: the
# notebooks with test_notebook_outputs.py and test_tools.py 840 s, the tests 886 s; so test_deliverable.py, about 25 s
# of small training runs, went beside the notebooks). Their logs are printed when both are done. The notebooks get their own MASTER_PORT
# so that a colocated trainer in each process never races for TRL's default port. --reruns 1: a headless kernel has
# been seen (once in CI, in a widget cell) to stop answering nbclient, which then waits out the per-cell timeout; the
# notebook then runs once more in a fresh kernel. A real failure fails twice.
EXECUTED_DIR ?= runs/executed
PYTEST_ARGS := -q -p no:cacheprovider --reruns 1 --durations=10
BESIDE_NOTEBOOKS := tests/test_notebook_outputs.py tests/test_tools.py tests/test_deliverable.py
test: install browser $(VERL_WHEEL)
	rm -rf $(EXECUTED_DIR) && mkdir -p $(EXECUTED_DIR) && cp notebooks/[0-9][0-9]_*.ipynb $(EXECUTED_DIR)/
	@export GRPO_LAB_VERL_SOURCE=$$(test -f $(VERL_WHEEL) && echo $(abspath $(VERL_WHEEL))) \
	  GRPO_LAB_EXECUTED_DIR=$(abspath $(EXECUTED_DIR)); start=$$(date +%s); \
	MASTER_PORT=29510 $(PY) -m pytest $(PYTEST_ARGS) --nbmake --nbmake-timeout=900 --overwrite $(EXECUTED_DIR) \
	  $(BESIDE_NOTEBOOKS) > $(EXECUTED_DIR).notebooks.log 2>&1 & notebooks=$$!; \
	$(PY) -m pytest $(PYTEST_ARGS) tests $(addprefix --ignore=,$(BESIDE_NOTEBOOKS)) > $(EXECUTED_DIR).tests.log 2>&1; \
	tests_rc=$$?; wait $$notebooks; notebooks_rc=$$?; \
	echo "== the notebooks, then $(BESIDE_NOTEBOOKS) (exit $$notebooks_rc)"; cat $(EXECUTED_DIR).notebooks.log; \
	echo "== the tests (exit $$tests_rc)"; cat $(EXECUTED_DIR).tests.log; \
	echo "make test: $$(( $$(date +%s) - start )) s"; test $$notebooks_rc = 0 && test $$tests_rc = 0

# verl's own config schema, to check the verl export against (notebook 07, tests/test_verl_export.py): the wheel
# is downloaded, never installed. Best effort: without it those checks skip and say so.
$(VERL_WHEEL): | install
	@mkdir -p $(dir $@)
	@$(PY) -m pip download --quiet --disable-pip-version-check --no-deps --dest $(dir $@) verl==$(VERL_VERSION) \
	  2>&1 | { grep -v "^WARNING: Location" || true; }; \
	  test -f $@ || echo "verl $(VERL_VERSION) not downloaded: the verl schema checks will be skipped"

# The widget test drives Debian's chromium (never a downloaded browser). Best effort: without root or
# apt-get the test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: the browser widget test will be skipped"

lab: install
	$(PY) -m jupyter lab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
	  --ServerApp.root_dir=$(CURDIR) --ServerApp.default_url=/lab/tree/notebooks \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

env: install
	$(VENV)/bin/grpo-lab env --smoke

clean-venv:
	rm -rf $(VENV)
