# Two commands for a newcomer: `make demo` and `make test`. Each sets up the
# virtual environment first (torch is pinned to the CPU build by constraints.txt).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The planes codecs' transform in C (compression="auto"): the extension module
# shardsafe.format._planes, which setup.py builds with the package (pip install -e below).
# KERNEL rebuilds it in place when its source changes; without a C compiler the build
# warns and codec.py runs the same transform in numpy (`shardsafe --version` says which).
KERNEL := $(VENV)/.kernel-stamp

.PHONY: demo demo-distributed test test-stress bench docs setup kernel clean gpu-check gpu-wheels

setup: $(STAMP) $(KERNEL)

kernel: $(KERNEL)

$(KERNEL): $(STAMP) src/shardsafe/format/_planes.c setup.py
	$(BIN)/python setup.py --quiet build_ext --inplace
	touch $@

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[torch,s3,dev,lightning,accelerate,transformers,torchtitan,zstd,bench,docs,jax]'
	touch $(STAMP)

demo: $(STAMP) $(KERNEL)
	$(BIN)/shardsafe demo

# the same crash-and-resume demo as an FSDP2 job on NPROC processes (gloo on the CPU)
NPROC ?= 2
demo-distributed: $(STAMP) $(KERNEL)
	$(BIN)/shardsafe demo --nproc $(NPROC)

test: $(STAMP) $(KERNEL)
	$(BIN)/python -m pytest -q -n 2

test-stress: $(STAMP) $(KERNEL)
	$(BIN)/python -m pytest -q -m stress

bench: $(STAMP) $(KERNEL)
	$(BIN)/shardsafe bench

# The GPU check (docs/development.md, "GPU check"): the CUDA tests and the GPU benchmark,
# everything recorded into GPU_OUT. Needs no virtual environment and no network, so that it
# runs as is on a lent GPU machine; without a GPU it says so and exits 0.
GPU_OUT ?= gpu-out
gpu-check:
	scripts/gpu-check $(GPU_OUT)

# Wheels (CPython 3.12, x86-64 Linux) of what shardsafe and its CUDA tests need and the GPU
# image lacks, into .gpu-wheels/ (git ignores it) to be carried there; needs a network.
GPU_WHEELS := crc32c==2.9.post0 zstandard==0.25.0
gpu-wheels:
	rm -rf .gpu-wheels.tmp
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .gpu-wheels.tmp $(GPU_WHEELS)
	rm -rf .gpu-wheels && mv .gpu-wheels.tmp .gpu-wheels && ls -l .gpu-wheels

# the documentation site (docs/ and mkdocs.yml) into site/; any warning fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build dist site src/*.egg-info src/shardsafe/format/_planes*.so .gpu-wheels gpu-out
