# ReplaySSM Bench. The two set-up commands are `make test` and `make reproduce`; the rest are parts.
# On a CPU box everything runs in .venv with the pinned CPU stack (constraints-cpu.txt).
# On a GPU box, reuse the CUDA torch you have: `make reproduce PY=python` (no venv is made then).

SHELL := /bin/bash
VENV  := .venv
PY    ?= $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONHASHSEED := 0

N ?= 5

.PHONY: test test-seeds lint bench-cpu kernel-report kernel-traffic reproduce venv clean test-gpu-stack

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

# The suite under N fresh seeds, one after another, each seed printed with its result (logs in .test-seeds/);
# exit 1 if any failed. Replay one: REPLAYSSM_TEST_SEED=<seed> make test. SEEDS=a,b reruns given seeds.
test-seeds: $(STAMP)
	$(VENV)/bin/python scripts/test_seeds.py -n $(N) $(if $(SEEDS),--seeds $(SEEDS))

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# CPU benchmark of every method with a backend="cpu" kernel (benchmarks/): a table per thread count of ms/step,
# GB/s, % of the measured copy plateau, speedup and byte model. REPLAYSSM_BENCH_THREADS / _BACKEND override.
bench-cpu: $(STAMP)
	$(VENV)/bin/python -m pytest benchmarks -q --benchmark-enable \
		--benchmark-columns=median,iqr,rounds --benchmark-sort=name -s

# Ahead-of-time build of every Triton kernel for sm_90 and sm_100: registers, spills, load widths; every state
# format a kernel stores (stochastic rounding, int8 / e4m3) included.
kernel-report: $(STAMP)
	env -u TRITON_INTERPRET $(VENV)/bin/python scripts/kernels/kernel_report.py --state-formats

kernel-traffic: $(STAMP)
	TRITON_INTERPRET=1 $(VENV)/bin/python scripts/kernels/kernel_traffic.py

# The GPU box's own stack, tested here (CI runs it after `make test`): its Triton 3.6.0 (torch 2.11.0+cu130 pins
# it) beside the CPU torch of constraints-cpu.txt, in .venv-gpustack; constraints-gpustack.txt holds the pins
# that differ (triton, and the numpy 3.6.0's interpreter needs) and wins over constraints-cpu.txt. It builds
# every Triton kernel ahead of time for sm_90 and sm_100 at the production geometries (kernel_report: fails on
# a build error or a spill; the two targets in parallel), then runs the Triton-kernel tests under the
# interpreter (GS_SELECT). Reports: .venv-gpustack/reports/.
GS_VENV   := .venv-gpustack
GS_PY     := $(GS_VENV)/bin/python
GS_STAMP  := $(GS_VENV)/.installed
GS_TRITON := $(shell sed -n 's/^triton==//p' constraints-gpustack.txt)
GS_SELECT := -k "triton or peer or fla or mamba_ssm or runtime_bound" tests/replayssm tests/baselines

$(GS_STAMP): pyproject.toml constraints-cpu.txt constraints-gpustack.txt
	python3 -m venv $(GS_VENV)
	$(GS_VENV)/bin/pip install --quiet --upgrade pip
	{ grep -viE "^($$(grep -oE '^[A-Za-z0-9_.-]+==' constraints-gpustack.txt | tr -d = | paste -sd'|'))==" \
		constraints-cpu.txt; cat constraints-gpustack.txt; } > $(GS_VENV)/constraints.txt
	$(GS_VENV)/bin/pip install --quiet -c $(GS_VENV)/constraints.txt -e '.[test]' einops fla-core==0.6.0
	MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
		$(GS_VENV)/bin/pip install --quiet --no-build-isolation --no-deps mamba-ssm==2.3.2.post1
	touch $(GS_STAMP)

test-gpu-stack: $(GS_STAMP)
	$(GS_PY) -c "import sys, numpy, torch, triton; print(f'gpu-stack: torch {torch.__version__}, triton' \
		f' {triton.__version__}, numpy {numpy.__version__}'); sys.exit(triton.__version__ != '$(GS_TRITON)')"
	@mkdir -p $(GS_VENV)/reports; rc=0; pids=""; \
	for t in 90 100; do \
		env -u TRITON_INTERPRET $(GS_PY) scripts/kernels/kernel_report.py --target $$t --state-formats \
			--csv $(GS_VENV)/reports/aot_sm$$t.csv > $(GS_VENV)/reports/aot_sm$$t.log 2>&1 & pids="$$pids $$!"; \
	done; \
	for p in $$pids; do wait $$p || rc=1; done; \
	for t in 90 100; do \
		echo "AOT sm_$$t (triton $(GS_TRITON)): $$(grep ' rows in ' $(GS_VENV)/reports/aot_sm$$t.log)"; \
	done; \
	if [ $$rc -ne 0 ]; then grep -h -A 40 '^FAIL' $(GS_VENV)/reports/aot_sm*.log; exit 1; fi
	TRITON_INTERPRET=1 $(GS_PY) -m pytest -n 2 --dist loadfile -q $(GS_SELECT)

# GPU box: `make reproduce PY=python` uses the python (and CUDA torch) you have and builds no CPU venv.
reproduce:
ifeq ($(PY),$(VENV)/bin/python)
	$(MAKE) venv
endif
	PY=$(PY) bash scripts/reproduce.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
