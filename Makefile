# make setup | make eval PROBLEM=softmax [SOLUTION=solutions/softmax/x.py] | make test | make leaderboard | make compare PROBLEM=softmax
# PYTHON=python3 runs everything under a python that already has torch, ninja, pyyaml, rich (and pytest).
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
PROBLEM ?=
SOLUTION ?=
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup eval test leaderboard compare selfcheck list

setup:
	python3 -m venv .venv
	.venv/bin/python -m pip install -q --upgrade pip
	.venv/bin/python -m pip install -q -e '.[test]'

eval:
	$(PYTHON) -m harness eval $(PROBLEM) $(if $(SOLUTION),--solution $(SOLUTION)) $(ARGS)

test:
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

leaderboard:
	$(PYTHON) -m harness leaderboard

compare:
	$(PYTHON) -m harness compare --problem $(PROBLEM) $(ARGS)

selfcheck:
	$(PYTHON) -m harness selfcheck $(PROBLEM)

list:
	$(PYTHON) -m harness list
