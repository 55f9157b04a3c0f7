"""The kernel experiments (one SSM layer: kernel_decode, kernel_spec): run.py checks, times and records their
points (run_experiment), beside experiments/hybrid/run.py (whole models) and experiments/vllm/run.py (vLLM).
"""
