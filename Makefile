# Two commands for a newcomer: `make demo` and `make test`. Each sets up the
# virtual environment first (torch is pinned to the CPU build by constraints.txt).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo demo-distributed test test-stress bench setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[torch,s3,dev,lightning,accelerate,zstd,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/shardsafe demo

# the same crash-and-resume demo as an FSDP2 job on NPROC processes (gloo on the CPU)
NPROC ?= 2
demo-distributed: $(STAMP)
	$(BIN)/shardsafe demo --nproc $(NPROC)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-stress: $(STAMP)
	$(BIN)/python -m pytest -q -m stress

bench: $(STAMP)
	$(BIN)/shardsafe bench

clean:
	rm -rf $(VENV) build dist src/*.egg-info
