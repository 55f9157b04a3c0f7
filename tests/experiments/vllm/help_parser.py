"""An argparse parser rebuilt from a vLLM `--help` text (fixture), so that commands are checked the way the
engine's own parser would check them: unknown flags, a flag missing its value, a value outside its choices.

Option lines are the ones indented by exactly two spaces ("  --max-num-seqs MAX_NUM_SEQS   help ...");
aliases are comma-separated ("--enable-prefix-caching, --no-enable-prefix-caching", "--max-model-len X, -ml X").
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
_OPTION = re.compile(r"^  (-{1,2}[A-Za-z0-9][\w-]*.*?)(?:\s{2,}.*)?$")


class ParseError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):                  # raise instead of exiting the test process
        raise ParseError(message)


def _add(parser: argparse.ArgumentParser, spec: str) -> None:
    names, kwargs = [], {"action": "store_true"}
    for alias in spec.split(", "):
        parts = alias.split(" ", 1)
        names.append(parts[0])
        if len(parts) == 2:
            meta = parts[1].strip()
            if meta.startswith("{"):
                kwargs = {"choices": meta.strip("{}").split(",")}
            elif meta.startswith("["):
                kwargs = {"nargs": "*"}
            elif "[" in meta:
                kwargs = {"nargs": "+"}
            else:
                kwargs = {}
    if names[0] in ("-h", "--help"):
        return
    if len(names) == 2 and names[1] == "--no-" + names[0][2:]:       # vLLM's BooleanOptionalAction flags
        parser.add_argument(names[0], action=argparse.BooleanOptionalAction)
        return
    parser.add_argument(*names, **kwargs)


def parser_from_help(text: str, positional: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(add_help=False, allow_abbrev=False)
    if positional:
        parser.add_argument(positional, nargs="?")
    for line in text.splitlines():
        m = _OPTION.match(line)
        if m and m.group(1).startswith("-"):
            _add(parser, m.group(1).strip())
    return parser


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def parsers(serve_help: str = "serve_help_fork.txt") -> dict[str, argparse.ArgumentParser]:
    """{'serve', 'bench serve', 'bench throughput'} parsers of the pinned fixtures."""
    serve = fixture(serve_help)
    # bench throughput = its own options + AsyncEngineArgs.add_cli_args: the engine sections of the same build
    throughput = fixture("bench_throughput_help.txt")
    throughput = throughput[:throughput.index("ModelConfig:")] + serve[serve.index("ModelConfig:"):]
    return {"serve": parser_from_help(serve, positional="model_tag"),
            "bench serve": parser_from_help(fixture("bench_serve_help.txt")),
            "bench throughput": parser_from_help(throughput)}


def parse_command(argv: list[str], serve_help: str = "serve_help_fork.txt") -> tuple[str, argparse.Namespace]:
    """Parse a full engine argv (exe first) with the parser of its sub-command."""
    sub = "serve" if argv[1] == "serve" else " ".join(argv[1:3])
    rest = argv[2:] if sub == "serve" else argv[3:]
    return sub, parsers(serve_help)[sub].parse_args(rest)
