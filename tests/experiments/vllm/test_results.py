"""Parsing vLLM's result files in the engine's real schema (fixtures), incl. a failed run and a missing metric."""

from __future__ import annotations

import json

import pytest
from help_parser import FIXTURES, fixture

from experiments.vllm.results import ResultError, parse_max_concurrency, parse_serve, parse_throughput


def test_throughput_json_and_stdout():
    m = parse_throughput(FIXTURES / "throughput.json", fixture("throughput_stdout.txt"))
    assert m["requests_per_s"] == pytest.approx(6.113689) and m["total_tokens_per_s"] == pytest.approx(2347.656)
    assert m["output_tokens_per_s"] == pytest.approx(1565.10) and m["completed"] == 256
    # without the printed summary line the output rate is unknown, never guessed
    assert parse_throughput(FIXTURES / "throughput.json", "")["output_tokens_per_s"] is None


def test_serve_json_with_spec_decoding():
    m = parse_serve(FIXTURES / "serve_spec.json")
    assert m["completed"] == 256 and m["failed"] == 0
    assert m["output_tokens_per_s"] == pytest.approx(1255.9) and m["requests_per_s"] == pytest.approx(4.906)
    assert m["ttft_median_ms"] == pytest.approx(149.8) and m["ttft_p99_ms"] == pytest.approx(250.9)
    assert m["tpot_mean_ms"] == pytest.approx(12.31) and m["tpot_p90_ms"] == pytest.approx(13.2)
    assert m["acceptance_length"] == pytest.approx(3.1405) and m["acceptance_rate_pct"] == pytest.approx(71.35)
    assert m["peak_concurrent_requests"] == 64.0


def test_serve_values_are_read_not_assumed(tmp_path, rng):
    """Fresh random values in the real schema come back unchanged."""
    data = json.loads(fixture("serve_spec.json"))
    keys = ["request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
            "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "spec_decode_acceptance_length"]
    for k in keys:
        data[k] = rng.uniform(0.5, 5000)
    data.pop("p90_ttft_ms")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    m = parse_serve(path)
    assert m["output_tokens_per_s"] == data["output_throughput"]
    assert m["tpot_p99_ms"] == data["p99_tpot_ms"] and m["acceptance_length"] == data["spec_decode_acceptance_length"]
    assert m["ttft_p90_ms"] is None                     # a percentile that was not requested is absent, not 0


def test_standard_serve_has_no_acceptance(tmp_path):
    data = {k: v for k, v in json.loads(fixture("serve_spec.json")).items() if not k.startswith("spec_decode")}
    (tmp_path / "s.json").write_text(json.dumps(data))
    assert parse_serve(tmp_path / "s.json")["acceptance_length"] is None


def test_failed_run_is_an_error_with_the_engines_message():
    with pytest.raises(ResultError, match=r"no request completed \(failed=256\).*ServerDisconnectedError"):
        parse_serve(FIXTURES / "serve_failed.json")


def test_missing_metric_is_named():
    with pytest.raises(ResultError, match="'mean_tpot_ms' missing"):
        parse_serve(FIXTURES / "serve_missing_metric.json")


@pytest.mark.parametrize("content, match", [(None, "wrote no result file"), ("{not json", "not JSON"),
                                            ("[1, 2]", "expected a JSON object"),
                                            ('{"completed": 3, "failed": 0, "request_throughput": NaN}', "finite"),
                                            ('{"elapsed_time": 0, "num_requests": 0, "requests_per_second": 0, '
                                             '"tokens_per_second": 0}', None)])
def test_bad_result_files(tmp_path, content, match):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    if match is None:                                   # a throughput run that processed nothing
        with pytest.raises(ResultError, match="no request was processed"):
            parse_throughput(path)
        return
    with pytest.raises(ResultError, match=match):
        parse_serve(path)


def test_max_concurrency_from_the_engine_log():
    assert parse_max_concurrency(fixture("server_log.txt")) == (87.31, 2048)
    assert parse_max_concurrency("INFO nothing here") == (None, None)
    two = ("Maximum concurrency for 1,024 tokens per request: 3.00x\n"
           "Maximum concurrency for 512 tokens per request: 9.50x")
    assert parse_max_concurrency(two) == (9.5, 512)
