# Two commands for a newcomer: `make demo` and `make test`. Each sets up the
# virtual environment first (torch is pinned to the CPU build by constraints.txt).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo demo-distributed test test-stress bench docs setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[torch,s3,dev,lightning,accelerate,zstd,bench,docs]'
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

# the documentation site (docs/ and mkdocs.yml) into site/; any warning fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build dist site src/*.egg-info
