# `make run`: set up both environments and the models (the first time: minutes), then serve
#             SmolLM2-135M-Instruct through the worker and answer a chat and a streaming job.
# `make test`: set up what is missing, lint (ruff: lint and import order) and type-check (mypy) src/,
#             then run the whole suite.
.PHONY: setup run test lint bench

setup:
	bash scripts/setup.sh

run: setup
	.venv/bin/python scripts/demo.py

lint:
	.venv/bin/python -m ruff check src
	.venv/bin/python -m mypy src

test: setup lint
	.venv/bin/python -m pytest -ra

bench: setup
	.venv/bin/python bench/proxy.py
	.venv/bin/python bench/startup.py
	.venv/bin/python bench/bad_config.py
