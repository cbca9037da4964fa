# make setup | make test | make test-all | make eval PROBLEM=softmax [SOLUTION=...] | make new PROBLEM=softmax NAME=mine
# make leaderboard | make compare PROBLEM=softmax | make selfcheck [PROBLEM=...] | make build | make list
# make prompt PROBLEM=softmax (a prompt asking a language model for a solution; PROBLEM may be a KernelBench .py)
# make eval-batch PROBLEM=softmax DIR=path | make eval-batch SUITE=problems/kb_level1 DIR=samples | make build DIR=path
# PYTHON=python3 runs everything under a python that already has torch, ninja, pyyaml, rich and pytest.
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
PROBLEM ?=
SOLUTION ?=
NAME ?=
DIR ?=
SUITE ?=
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup eval eval-batch new test test-all leaderboard compare selfcheck build list

# The versions CI tests with (constraints.txt).
setup:
	python3 -m venv .venv
	.venv/bin/python -m pip install -q --upgrade pip
	.venv/bin/python -m pip install -q -c constraints.txt -e '.[test]'

eval:
	$(PYTHON) -m harness eval $(PROBLEM) $(if $(SOLUTION),--solution $(SOLUTION)) $(ARGS)

# Every .py in DIR a candidate of PROBLEM, or DIR/<problem>/*.py for each problem of SUITE: records and summary
# under results/batch/<name>/ (GPU) or .scratch/batch/<name>/ (CPU).
eval-batch:
	$(PYTHON) -m harness eval-batch $(if $(SUITE),--suite $(SUITE),$(PROBLEM)) --dir $(DIR) $(ARGS)

new:
	$(PYTHON) -m harness new $(PROBLEM) $(NAME)

prompt:
	@$(PYTHON) -m harness prompt $(PROBLEM)

# Under 5 minutes on 2 cores: everything but the nvcc builds and the exhaustive exploit sweep.
test:
	$(PYTHON) -m pytest -q -ra -m "not compile and not slow" $(PYTEST_ARGS)

# Everything (what CI runs): the nvcc builds run where CUDA_HOME has nvcc, GPU tests where there is a GPU.
test-all:
	$(PYTHON) -m pytest -q -ra $(PYTEST_ARGS)

leaderboard:
	$(PYTHON) -m harness leaderboard

compare:
	$(PYTHON) -m harness compare --problem $(PROBLEM) $(ARGS)

selfcheck:
	$(PYTHON) -m harness selfcheck $(PROBLEM)

# With DIR: a batch's candidates (as eval-batch would build them), on any machine with nvcc, no GPU needed.
build:
	$(PYTHON) -m harness build $(if $(SUITE),--suite $(SUITE),$(PROBLEM)) $(if $(DIR),--dir $(DIR)) $(ARGS)

list:
	$(PYTHON) -m harness list
