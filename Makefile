# Two commands for a newcomer: `make demo` and `make test`. Each sets up the
# virtual environment first (torch is pinned to the CPU build by constraints.txt).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# the planes codecs' transform in C (compression="auto"); format/planes_kernel.py loads it
# and, where it is missing (no C compiler), codec.py runs the same transform in numpy
KERNEL := src/shardsafe/format/_planes.so
KFLAGS := -O3 -std=c99 -fPIC -shared

.PHONY: demo demo-distributed test test-stress bench docs setup kernel clean

setup: $(STAMP) $(KERNEL)

kernel: $(KERNEL)

$(KERNEL): src/shardsafe/format/_planes.c
	@{ $(CC) $(KFLAGS) -o $@.tmp $< || $(CC) $(KFLAGS) -DSHARDSAFE_NO_CLONES -o $@.tmp $<; } \
	  && mv $@.tmp $@ \
	  || { rm -f $@ $@.tmp; echo "note: could not compile $<; compression='auto' uses numpy (slower)"; }

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[torch,s3,dev,lightning,accelerate,zstd,bench,docs,jax]'
	touch $(STAMP)

demo: $(STAMP) $(KERNEL)
	$(BIN)/shardsafe demo

# the same crash-and-resume demo as an FSDP2 job on NPROC processes (gloo on the CPU)
NPROC ?= 2
demo-distributed: $(STAMP) $(KERNEL)
	$(BIN)/shardsafe demo --nproc $(NPROC)

test: $(STAMP) $(KERNEL)
	$(BIN)/python -m pytest -q

test-stress: $(STAMP) $(KERNEL)
	$(BIN)/python -m pytest -q -m stress

bench: $(STAMP) $(KERNEL)
	$(BIN)/shardsafe bench

# the documentation site (docs/ and mkdocs.yml) into site/; any warning fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build dist site src/*.egg-info $(KERNEL)
