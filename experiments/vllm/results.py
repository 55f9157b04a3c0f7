"""vLLM's benchmark output -> metrics, in the engine's real schema (pure functions; fixtures in
tests/experiments/fixtures/vllm/ name the source they follow).

`vllm bench throughput --output-json` (vllm/benchmarks/throughput.py, main()): elapsed_time, num_requests,
total_num_tokens, requests_per_second, tokens_per_second (prompt + output tokens). Output tokens/s is only
printed ("Throughput: X requests/s, Y total tokens/s, Z output tokens/s"), so it is read from stdout.

`vllm bench serve --save-result` (vllm/benchmarks/serve.py, benchmark()): duration, completed, failed,
total_input_tokens, total_output_tokens, request_throughput, output_throughput, total_token_throughput,
max_concurrent_requests, errors, mean_/median_/std_/p<N>_{ttft,tpot,itl,e2el}_ms, and with speculative
decoding on the server spec_decode_acceptance_rate (%), spec_decode_acceptance_length (1 + accepted/drafts),
spec_decode_num_drafts, _draft_tokens, _accepted_tokens, _per_position_acceptance_rates.

Server log (vllm/v1/core/kv_cache_utils.py): "Maximum concurrency for N tokens per request: X.XXx".
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path


class ResultError(ValueError):
    """The benchmark ran but its result says it failed, or a required metric is missing."""


_THROUGHPUT_LINE = re.compile(r"Throughput:\s*([\d.]+)\s*requests/s,\s*([\d.]+)\s*total tokens/s"
                              r"(?:,\s*([\d.]+)\s*output tokens/s)?")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x")

THROUGHPUT_REQUIRED = ("elapsed_time", "num_requests", "requests_per_second", "tokens_per_second")
SERVE_REQUIRED = ("completed", "failed", "request_throughput", "output_throughput", "total_token_throughput",
                  "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms")
# our column <- the serve JSON key (present only when the percentile was requested / spec decode was on)
SERVE_OPTIONAL = {
    "ttft_p90_ms": "p90_ttft_ms", "ttft_p99_ms": "p99_ttft_ms", "tpot_p90_ms": "p90_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms", "itl_median_ms": "median_itl_ms", "itl_p99_ms": "p99_itl_ms",
    "e2el_median_ms": "median_e2el_ms", "e2el_p99_ms": "p99_e2el_ms",
    "acceptance_length": "spec_decode_acceptance_length", "acceptance_rate_pct": "spec_decode_acceptance_rate",
    "peak_concurrent_requests": "max_concurrent_requests",
}


def _load(path: Path | str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ResultError(f"{path.name}: the benchmark wrote no result file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultError(f"{path.name}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ResultError(f"{path.name}: expected a JSON object, got {type(data).__name__}")
    return data


def _number(data: dict, key: str, source: str) -> float:
    if key not in data or data[key] is None:
        raise ResultError(f"{source}: metric {key!r} missing from the result")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ResultError(f"{source}: metric {key!r} is not a finite number ({value!r})")
    return float(value)


def parse_throughput(json_path: Path | str, stdout: str = "") -> dict:
    """Metrics of one `vllm bench throughput` run."""
    name = Path(json_path).name
    data = _load(json_path)
    vals = {k: _number(data, k, name) for k in THROUGHPUT_REQUIRED}
    if vals["num_requests"] <= 0 or vals["elapsed_time"] <= 0:
        raise ResultError(f"{name}: no request was processed (num_requests={vals['num_requests']:g}, "
                          f"elapsed_time={vals['elapsed_time']:g})")
    out = {"requests_per_s": vals["requests_per_second"], "total_tokens_per_s": vals["tokens_per_second"],
           "completed": int(vals["num_requests"]), "failed": 0, "duration_s": vals["elapsed_time"],
           "output_tokens_per_s": None}
    found = list(_THROUGHPUT_LINE.finditer(stdout or ""))
    m = found[-1] if found else None             # the last summary line is the run's
    if m is not None and m.group(3) is not None:
        out["output_tokens_per_s"] = float(m.group(3))
    return out


def parse_serve(json_path: Path | str) -> dict:
    """Metrics of one `vllm bench serve` run; a run where no request completed is a ResultError."""
    name = Path(json_path).name
    data = _load(json_path)
    completed, failed = _number(data, "completed", name), _number(data, "failed", name)
    if completed <= 0:
        errors = [e for e in data.get("errors") or [] if e]
        first = f"; first error: {str(errors[0]).strip().splitlines()[-1][:200]}" if errors else ""
        raise ResultError(f"{name}: no request completed (failed={int(failed)}){first}")
    vals = {k: _number(data, k, name) for k in SERVE_REQUIRED}
    out = {"completed": int(completed), "failed": int(failed), "duration_s": data.get("duration"),
           "requests_per_s": vals["request_throughput"], "output_tokens_per_s": vals["output_throughput"],
           "total_tokens_per_s": vals["total_token_throughput"],
           "ttft_mean_ms": vals["mean_ttft_ms"], "ttft_median_ms": vals["median_ttft_ms"],
           "tpot_mean_ms": vals["mean_tpot_ms"], "tpot_median_ms": vals["median_tpot_ms"]}
    for col, key in SERVE_OPTIONAL.items():
        v = data.get(key)
        out[col] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
            else None
    return out


def parse_max_concurrency(log_text: str) -> tuple[float | None, int | None]:
    """(max concurrency, tokens per request) from the engine's own KV-cache log line; the last one wins
    (the engine logs it once per start). (None, None) when absent."""
    found = _MAX_CONCURRENCY.findall(log_text or "")
    if not found:
        return None, None
    tokens, conc = found[-1]
    return float(conc), int(tokens.replace(",", ""))
