# ReplaySSM Bench. The two set-up commands are `make test` and `make reproduce`; the rest are parts.
# On a CPU box everything runs in .venv with the pinned CPU stack (constraints-cpu.txt).
# On a GPU box, reuse the CUDA torch you have: `make reproduce PY=python` (no venv is made then).

SHELL := /bin/bash
VENV  := .venv
PY    ?= $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: test lint bench-cpu kernel-report kernel-traffic reproduce venv clean

$(STAMP): pyproject.toml constraints-cpu.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints-cpu.txt -e '.[test,slurm,local]'
	# Installed peers run beside our kernels (baselines/peers.py). On CPU: their Triton ops only, so mamba_ssm is
	# built without its CUDA extensions and without its GPU-only dependencies.
	$(VENV)/bin/pip install --quiet -c constraints-cpu.txt einops fla-core==0.6.0
	MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
		$(VENV)/bin/pip install --quiet --no-build-isolation --no-deps mamba-ssm==2.3.2.post1
	touch $(STAMP)

venv: $(STAMP)

# The whole suite on CPU: Triton kernels run under the interpreter (TRITON_INTERPRET=1).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	TRITON_INTERPRET=1 $(VENV)/bin/python -m pytest -n 2 --dist loadfile -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# CPU benchmark of every method with a backend="cpu" kernel (benchmarks/): a table per thread count of ms/step,
# GB/s, % of the measured copy plateau, speedup and byte model. REPLAYSSM_BENCH_THREADS / _BACKEND override.
bench-cpu: $(STAMP)
	$(VENV)/bin/python -m pytest benchmarks -q --benchmark-enable \
		--benchmark-columns=median,iqr,rounds --benchmark-sort=name -s

# Ahead-of-time build of every Triton kernel for sm_90 and sm_100: registers, spills, load widths.
kernel-report: $(STAMP)
	$(VENV)/bin/python scripts/kernels/kernel_report.py

kernel-traffic: $(STAMP)
	TRITON_INTERPRET=1 $(VENV)/bin/python scripts/kernels/kernel_traffic.py

# GPU box: `make reproduce PY=python` uses the python (and CUDA torch) you have and builds no CPU venv.
reproduce:
ifeq ($(PY),$(VENV)/bin/python)
	$(MAKE) venv
endif
	PY=$(PY) bash scripts/reproduce.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
