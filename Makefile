# ggrad: `make demo` trains on the default device, `make test` runs the suite.
# Both set everything up first (scripts/bootstrap.sh): .venv, packages, and the
# Vulkan build of ggml where this machine can have it (cached in ~/.cache/ggrad).
PY := .venv/bin/python
# ggml lists a Vulkan device that runs on the CPU (lavapipe) only when asked to.
export GGML_VK_VISIBLE_DEVICES ?= 0

.PHONY: setup test demo vulkan cpu bench clean

setup:
	bash scripts/bootstrap.sh

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(PY) examples/runtime_tour.py

vulkan:
	GGRAD_BACKEND=vulkan bash scripts/bootstrap.sh

cpu:
	GGRAD_BACKEND=cpu bash scripts/bootstrap.sh

clean:
	rm -rf .venv .pytest_cache
