"""Command construction per mode and per dialect, checked with parsers rebuilt from the pinned help texts."""

from __future__ import annotations

import json
import random

import pytest
from help_parser import ParseError, fixture, parse_command

from experiments.vllm.commands import (
    MODES,
    EnginePoint,
    Unsupported,
    bench_serve_command,
    serve_command,
    throughput_command,
)
from experiments.vllm.dialect import Dialect, detect_dialect

DIALECTS = {
    "fork": ("serve_help_fork.txt", detect_dialect(fixture("serve_help_fork.txt"))),
    "upstream": ("serve_help_upstream.txt", detect_dialect(fixture("serve_help_upstream.txt"))),
}


def strip_replayssm(text: str) -> str:
    """A help text without any ReplaySSM option (an engine that predates it)."""
    out, skip = [], False
    for line in text.splitlines():
        if line.startswith("  --"):
            skip = "replayssm" in line
        elif not line.startswith("     "):
            skip = False
        if not skip:
            out.append(line)
    return "\n".join(out)


def point(mode: str, bench: str, family: str = "gdn", n: int | None = None, **kw) -> EnginePoint:
    rng = random.Random(f"{mode}{bench}{family}")
    spec = mode in ("native_spec", "replayssm_spec")
    base = dict(model="m", hf_id="org/Model-4B", family=family, tp=rng.choice([1, 2]), mode=mode, bench=bench,
                max_num_seqs=n or rng.choice([1, 7, 64, 512]), num_spec_tokens=3 if spec else None,
                buffer_len=16 if "replayssm" in mode else None,
                route="output_only" if mode == "replayssm_ar" and family == "mamba2" else None,
                mtp_method="mtp" if spec else None, dataset="random", dataset_path=None, input_len=128,
                output_len=256, num_prompts=64, temperature=0.0 if bench == "serve" else None, max_model_len=2048,
                gpu_memory_utilization=0.9, seed=0)
    base.update(kw)
    return EnginePoint(**base)


def test_dialects_from_the_pinned_help_texts():
    assert DIALECTS["fork"][1].name == "fork" and DIALECTS["fork"][1].has_spec
    up = DIALECTS["upstream"][1]
    assert up.name == "upstream" and up.has_ar and not up.has_spec
    none = detect_dialect(strip_replayssm(fixture("serve_help_fork.txt")))
    assert none.name == "none" and "--max-num-seqs" in none.flags and "--use-replayssm" not in none.flags
    with pytest.raises(ValueError, match="not a vLLM engine-args help"):
        detect_dialect(fixture("bench_serve_help.txt"))


@pytest.mark.parametrize("dialect_name", ["fork", "upstream"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_serve_and_throughput_commands_parse(dialect_name, mode, family):
    help_file, dialect = DIALECTS[dialect_name]
    if mode == "replayssm_spec" and dialect_name == "upstream":
        with pytest.raises(Unsupported, match="--use-replayssm-spec"):
            serve_command("vllm", point(mode, "serve", family), dialect, 8123)
        return
    p = point(mode, "serve", family)
    sub, args = parse_command(serve_command("/opt/bin/vllm", p, dialect, 8123), serve_help=help_file)
    assert sub == "serve" and args.model_tag == p.hf_id and args.host == "127.0.0.1" and args.port == "8123"
    assert int(args.max_num_seqs) == p.max_num_seqs and int(args.tensor_parallel_size) == p.tp
    assert args.enable_prefix_caching is False
    assert bool(args.use_replayssm) == (mode == "replayssm_ar")
    assert bool(getattr(args, "use_replayssm_spec", False)) == (mode == "replayssm_spec")
    assert (args.replayssm_buffer_len == "16") == ("replayssm" in mode)
    assert (args.mamba_cache_mode == "none") == ("replayssm" in mode)
    assert args.replayssm_route == ("output_only" if mode == "replayssm_ar" and family == "mamba2" else None)
    if mode in ("native_spec", "replayssm_spec"):
        assert json.loads(args.speculative_config) == {"method": "mtp", "num_speculative_tokens": 3}
    else:
        assert args.speculative_config is None
    tp = point(mode, "throughput", family)
    sub, targs = parse_command(throughput_command("vllm", tp, dialect, "/tmp/o.json"), serve_help=help_file)
    assert sub == "bench throughput" and targs.model == tp.hf_id and targs.output_json == "/tmp/o.json"
    assert targs.dataset_name == "random" and targs.input_len == "128" and targs.output_len == "256"
    assert bool(targs.use_replayssm) == (mode == "replayssm_ar")


def test_no_replayssm_dialect_refuses_replayssm_modes_and_still_runs_the_rest():
    none = detect_dialect(strip_replayssm(fixture("serve_help_fork.txt")))
    for mode in ("replayssm_ar", "replayssm_spec"):
        with pytest.raises(Unsupported):
            serve_command("vllm", point(mode, "serve"), none, 1)
    argv = serve_command("vllm", point("native_spec", "serve"), none, 1)
    assert "--speculative-config" in argv and not any("replayssm" in a for a in argv)


def test_optional_flags_only_when_the_engine_lists_them():
    bare = Dialect("fork", frozenset({"--use-replayssm", "--use-replayssm-spec", "--replayssm-buffer-len"}))
    argv = serve_command("vllm", point("replayssm_ar", "serve", "mamba2"), bare, 1)
    assert "--mamba-cache-mode" not in argv and "--replayssm-route" not in argv
    assert "--no-enable-prefix-caching" not in argv


def test_bench_serve_command_parses_and_is_loopback():
    p = point("replayssm_spec", "serve", n=64)
    argv = bench_serve_command("vllm", p, 8123, "/tmp/run/p0", "serve.json")
    sub, args = parse_command(argv)
    assert sub == "bench serve" and args.host == "127.0.0.1" and args.port == "8123"
    assert args.max_concurrency == "64" and args.request_rate == "inf" and args.ignore_eos
    assert args.temperature == "0" and args.save_result and args.result_filename == "serve.json"
    assert args.dataset_name == "random" and args.random_output_len == "256"
    assert set(args.percentile_metrics.split(",")) >= {"ttft", "tpot"}


def test_gsm8k_prompts_go_through_the_custom_dataset():
    p = point("standard", "serve", dataset="gsm8k", dataset_path="/data/gsm8k.jsonl")
    _, args = parse_command(bench_serve_command("vllm", p, 1, "/tmp", "s.json"))
    assert args.dataset_name == "custom" and args.dataset_path == "/data/gsm8k.jsonl"
    assert args.custom_output_len == "256" and args.random_input_len is None
    with pytest.raises(Unsupported, match="bench=serve"):
        throughput_command("vllm", point("standard", "throughput", dataset="gsm8k", dataset_path="/x"),
                           DIALECTS["fork"][1], "/tmp/o.json")


def test_the_parser_rejects_what_the_engine_would():
    """The check above can fail: an unknown flag or a missing value is refused."""
    with pytest.raises(ParseError):
        parse_command(["vllm", "serve", "m", "--use-replayssm-specc"])
    with pytest.raises(ParseError):
        parse_command(["vllm", "serve", "m", "--use-replayssm-spec"], serve_help="serve_help_upstream.txt")
    with pytest.raises(ParseError):
        parse_command(["vllm", "bench", "serve", "--max-concurrency"])
    with pytest.raises(ValueError, match="serve_command"):
        serve_command("vllm", point("standard", "throughput"), DIALECTS["fork"][1], 1)


def test_engine_version_from_version_output():
    from experiments.vllm.dialect import parse_version

    assert parse_version("0.31.0\n") == "0.31.0"
    assert parse_version("INFO warming up\n0.11.1rc2.dev5+g1a2b3c") == "0.11.1rc2.dev5+g1a2b3c"
    assert parse_version("") is None
