"""The argv of every engine command, as pure functions of one engine point and the engine's dialect.

Modes (ReplaySSM blog §6; the fork Johnny-Liou/ReplaySSM's benchmarks/replayssm/e2e_*.py):
    standard        plain decode
    native_spec     vLLM's own speculative decoding with the model's MTP drafter, T = 1 + 3 (window 4)
    replayssm_ar    standard decode with ReplaySSM (`--use-replayssm`, buffer L)
    replayssm_spec  MTP speculative decoding with ReplaySSM (`--use-replayssm-spec`, history B)
Engine settings shared by all modes follow the fork's e2e harness: prefix caching off (ReplaySSM needs
`mamba_cache_mode=none` in the fork), CUDA graphs on (vLLM's default), one seed. A mode the installed
dialect cannot express raises Unsupported (the point is recorded as skipped, with the reason).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass

from experiments.vllm.dialect import AR_FLAG, BUFFER_FLAG, ROUTE_FLAG, SPEC_FLAG, Dialect

MODES = ("standard", "native_spec", "replayssm_ar", "replayssm_spec")
BENCHES = ("throughput", "serve")
SPEC_MODES = ("native_spec", "replayssm_spec")
REPLAYSSM_MODES = ("replayssm_ar", "replayssm_spec")
LOOPBACK = "127.0.0.1"


class Unsupported(Exception):
    """The installed engine's dialect has no way to run this mode."""


@dataclass(frozen=True)
class EnginePoint:
    """One engine measurement: a model served in one mode, measured by one benchmark at one max-num-seqs."""

    model: str                     # harness model name (conf/model)
    hf_id: str                     # what the engine loads
    family: str                    # mamba2 | gdn
    tp: int
    mode: str
    bench: str                     # throughput (offline) | serve (online, against `vllm serve`)
    max_num_seqs: int              # the batch: --max-num-seqs, and --max-concurrency of the serve client
    num_spec_tokens: int | None    # drafts per step (T = 1 + this); None outside the spec modes
    buffer_len: int | None         # ReplaySSM L (AR) or history B (spec); None outside the ReplaySSM modes
    route: str | None              # Mamba-2 ReplaySSM AR route; None otherwise
    mtp_method: str | None         # speculative-config method of the model's MTP drafter
    dataset: str                   # gsm8k (a local jsonl of prompts) | random
    dataset_path: str | None
    input_len: int                 # random prompts only
    output_len: int
    num_prompts: int
    temperature: float | None      # None: the benchmark's own fixed sampling (bench throughput)
    max_model_len: int
    gpu_memory_utilization: float
    seed: int

    @property
    def spec_T(self) -> int | None:
        return None if self.num_spec_tokens is None else 1 + self.num_spec_tokens

    def key(self) -> dict:
        return asdict(self)


def engine_args(p: EnginePoint, dialect: Dialect) -> list[str]:
    """Engine flags shared by `vllm serve` and `vllm bench throughput` (both take the engine's arg parser)."""
    args = ["--tensor-parallel-size", str(p.tp), "--max-num-seqs", str(p.max_num_seqs),
            "--max-model-len", str(p.max_model_len), "--gpu-memory-utilization", str(p.gpu_memory_utilization),
            "--seed", str(p.seed)]
    if dialect.has("--no-enable-prefix-caching"):
        args.append("--no-enable-prefix-caching")
    if p.mode in SPEC_MODES:
        spec = {"method": p.mtp_method, "num_speculative_tokens": p.num_spec_tokens}
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if p.mode in REPLAYSSM_MODES:
        args += replayssm_args(p, dialect)
    return args


def replayssm_args(p: EnginePoint, dialect: Dialect) -> list[str]:
    """The ReplaySSM flags of this mode in the engine's dialect; Unsupported when it has none."""
    if p.mode == "replayssm_ar":
        if not dialect.has_ar:
            raise Unsupported(f"the installed engine has no {AR_FLAG} flag (dialect {dialect.name!r})")
        args = [AR_FLAG, BUFFER_FLAG, str(p.buffer_len)]
        if p.family == "mamba2" and p.route and dialect.has(ROUTE_FLAG):
            args += [ROUTE_FLAG, p.route]
    elif p.mode == "replayssm_spec":
        if not dialect.has_spec:
            raise Unsupported(f"the installed engine has no {SPEC_FLAG} flag (dialect {dialect.name!r}): "
                              "ReplaySSM speculative decoding is not in this build")
        args = [SPEC_FLAG, BUFFER_FLAG, str(p.buffer_len)]
    else:
        return []
    if dialect.has("--mamba-cache-mode"):
        args += ["--mamba-cache-mode", "none"]      # the fork refuses ReplaySSM with any other mode
    return args


def serve_command(exe: str, p: EnginePoint, dialect: Dialect, port: int) -> list[str]:
    """`vllm serve MODEL ...` bound to loopback only."""
    if p.bench != "serve":
        raise ValueError(f"serve_command: point is a {p.bench!r} point")
    return [exe, "serve", p.hf_id, "--host", LOOPBACK, "--port", str(port), *engine_args(p, dialect)]


def _dataset_args(p: EnginePoint, bench: str) -> list[str]:
    if p.dataset == "gsm8k":
        if bench == "throughput":
            raise Unsupported("vllm bench throughput has no custom-prompt dataset here; GSM8K prompts are "
                              "measured with bench=serve")
        return ["--dataset-name", "custom", "--dataset-path", str(p.dataset_path),
                "--custom-output-len", str(p.output_len)]
    if bench == "throughput":
        return ["--dataset-name", "random", "--input-len", str(p.input_len), "--output-len", str(p.output_len)]
    return ["--dataset-name", "random", "--random-input-len", str(p.input_len),
            "--random-output-len", str(p.output_len)]


def bench_serve_command(exe: str, p: EnginePoint, port: int, result_dir: str, result_filename: str) -> list[str]:
    """`vllm bench serve` against the loopback server: all requests at t=0, at most max_num_seqs in flight."""
    argv = [exe, "bench", "serve", "--host", LOOPBACK, "--port", str(port), "--model", p.hf_id,
            *_dataset_args(p, "serve"), "--num-prompts", str(p.num_prompts),
            "--max-concurrency", str(p.max_num_seqs), "--request-rate", "inf", "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--seed", str(p.seed), "--save-result", "--result-dir", result_dir,
            "--result-filename", result_filename]
    if p.temperature is not None:
        argv += ["--temperature", f"{p.temperature:g}"]
    return argv


def throughput_command(exe: str, p: EnginePoint, dialect: Dialect, output_json: str) -> list[str]:
    """`vllm bench throughput` (offline, the LLM class): the engine runs in the benchmark's own process."""
    if p.bench != "throughput":
        raise ValueError(f"throughput_command: point is a {p.bench!r} point")
    return [exe, "bench", "throughput", "--model", p.hf_id, *_dataset_args(p, "throughput"),
            "--num-prompts", str(p.num_prompts), *engine_args(p, dialect), "--output-json", output_json]


def shell_line(argv: list[str]) -> str:
    """The command as one copy-pasteable shell line (what each row records)."""
    return shlex.join(argv)
