# `make run`: set up both environments and the models (the first time: minutes), then serve
#             SmolLM2-135M-Instruct through the worker and answer a chat and a streaming job.
# `make image`: build the worker's image here (Docker engine, the CPU stand-in for vLLM's image, then
#             vllm-worker:local; docs/deploy.md). Needs root; the last line says how to run it.
# `make test`: set up what is missing (the demo model aside: no test serves it), lint (ruff: lint and
#             import order) and type-check (mypy) src/, then run the whole suite.
.PHONY: setup setup-tests run test lint bench image

setup:
	bash scripts/setup.sh

setup-tests:
	bash scripts/setup.sh --tests

run: setup
	.venv/bin/python scripts/demo.py

lint:
	.venv/bin/python -m ruff check src
	.venv/bin/python -m mypy src

# Two test processes, a test file each at a time: an engine boot is three Python imports of vLLM one
# after another (one core), so two files share the two cores of the machine the suite was sized on.
# Files in collection order, the slowest first (tests/conftest.py says why).
PYTEST_WORKERS ?= 2

test: setup-tests lint
	.venv/bin/python -m pytest -ra -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40

bench: setup
	.venv/bin/python bench/proxy.py
	.venv/bin/python bench/startup.py
	.venv/bin/python bench/bad_config.py

image:
	bash scripts/image/build.sh
