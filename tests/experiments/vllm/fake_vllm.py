#!/usr/bin/env python3
"""A stand-in for the `vllm` CLI in tests: `--version`, `serve --help[=all]`, `serve`, `bench serve`,
`bench throughput`. Arguments are checked with parsers rebuilt from the pinned help fixtures; outputs follow
vLLM's real result schema (the fixtures). Binds 127.0.0.1 only.

Environment: FAKE_VLLM_HELP (serve help fixture name), FAKE_VLLM_STATE (a directory: pids and the server's
argv), FAKE_VLLM_SERVE = ok | never_ready | crash, FAKE_VLLM_BENCH = ok | fail | no_requests.
"""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from help_parser import FIXTURES, ParseError, fixture, parse_command  # noqa: E402

STATE = Path(os.environ.get("FAKE_VLLM_STATE", "."))
HELP = os.environ.get("FAKE_VLLM_HELP", "serve_help_fork.txt")


def record(name: str, data) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / name, "a") as f:
        f.write(json.dumps(data) + "\n")


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def serve(args, argv) -> int:
    record("pids", {"pid": os.getpid(), "cmd": "serve"})
    if args.host != "127.0.0.1":
        print(f"refusing to bind {args.host}", flush=True)
        return 3
    mode = os.environ.get("FAKE_VLLM_SERVE", "ok")
    print("INFO vLLM API server version 0.31.0+fake", flush=True)
    if mode == "crash":
        print("RuntimeError: CUDA error: no kernel image is available", flush=True)
        return 1
    if mode == "never_ready":
        while True:
            time.sleep(1)
    (STATE / "server_argv.json").write_text(json.dumps(argv))
    print(f"INFO Maximum concurrency for {int(args.max_model_len):,} tokens per request: 12.50x", flush=True)
    HTTPServer(("127.0.0.1", int(args.port)), Health).serve_forever()
    return 0


def bench_serve(args) -> int:
    import urllib.request

    urllib.request.urlopen(f"http://{args.host}:{args.port}/health", timeout=5).close()   # the server must be up
    server_argv = json.loads((STATE / "server_argv.json").read_text())
    result = json.loads((FIXTURES / "serve_spec.json").read_text())
    if "--speculative-config" not in server_argv:
        result = {k: v for k, v in result.items() if not k.startswith("spec_decode")}
    # a deterministic per-mode throughput, so that engine ratios in tests are known
    factor = 1.0 + 0.25 * ("--use-replayssm" in server_argv or "--use-replayssm-spec" in server_argv) \
        + 0.5 * ("--speculative-config" in server_argv)
    result["output_throughput"] = 1000.0 * factor * int(args.max_concurrency)
    n = int(args.num_prompts)
    result.update(max_concurrency=int(args.max_concurrency), num_prompts=n, completed=n)
    if os.environ.get("FAKE_VLLM_BENCH") == "no_requests":
        result = json.loads((FIXTURES / "serve_failed.json").read_text())
    if os.environ.get("FAKE_VLLM_BENCH") == "fail":
        print("Traceback: aiohttp.ClientConnectorError", flush=True)
        return 1
    Path(args.result_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.result_dir) / args.result_filename).write_text(json.dumps(result))
    return 0


def bench_throughput(args) -> int:
    print(fixture("throughput_stdout.txt"), flush=True)
    Path(args.output_json).write_text(fixture("throughput.json"))
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print("0.31.0+fake")
        return 0
    if argv[:1] == ["serve"] and argv[1:2] and argv[1].startswith("--help"):
        print(fixture(HELP))
        return 0
    try:
        sub, args = parse_command(["vllm", *argv], serve_help=HELP)
    except (ParseError, IndexError, KeyError) as exc:
        print(f"vllm: error: {exc}", file=sys.stderr)
        return 2
    return {"serve": lambda: serve(args, argv), "bench serve": lambda: bench_serve(args),
            "bench throughput": lambda: bench_throughput(args)}[sub]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
