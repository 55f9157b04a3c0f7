"""Which ReplaySSM flags the installed vLLM understands, read from its own `--help` text.

Three dialects exist (the official fork Johnny-Liou/ReplaySSM; vLLM PRs #48018, #49847):
    fork      Johnny-Liou/ReplaySSM (and the upstream spec PR #49847 branch): `--use-replayssm` (AR),
              `--use-replayssm-spec` (speculative), `--replayssm-buffer-len`, `--replayssm-route` (Mamba-2)
    upstream  vLLM main after #48018 (merged): the same `--use-replayssm` / `--replayssm-buffer-len` names for
              standard decode, but no speculative flag (the spec PR #49847 was still open, and its review
              proposed gating spec under `--use-replayssm` + num_speculative_tokens > 0 instead)
    none      no ReplaySSM flag at all: only the standard and native-speculative modes can run
Flags the engine may or may not have (e.g. `--mamba-cache-mode`) are only passed when its help lists them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A long option as argparse prints it: "--max-num-seqs MAX_NUM_SEQS", "--enable-prefix-caching, --no-...".
_FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
_VERSION = re.compile(r"(\d+\.\d+[0-9A-Za-z.+-]*)")

AR_FLAG = "--use-replayssm"
SPEC_FLAG = "--use-replayssm-spec"
BUFFER_FLAG = "--replayssm-buffer-len"
ROUTE_FLAG = "--replayssm-route"


def help_flags(text: str) -> frozenset[str]:
    """Every long option named in an argparse help text."""
    return frozenset(_FLAG.findall(text or ""))


@dataclass(frozen=True)
class Dialect:
    """The flag dialect of one installed engine: its name and every flag its `serve --help` lists."""

    name: str                       # fork | upstream | none
    flags: frozenset[str]

    @property
    def has_ar(self) -> bool:
        return self.name in ("fork", "upstream")

    @property
    def has_spec(self) -> bool:
        return self.name == "fork"

    def has(self, flag: str) -> bool:
        return flag in self.flags


def detect_dialect(serve_help: str) -> Dialect:
    """The dialect of `vllm serve --help` output; ValueError if the text is not an engine-args help."""
    flags = help_flags(serve_help)
    if "--max-num-seqs" not in flags or ("--model" not in flags and "--tensor-parallel-size" not in flags):
        raise ValueError("not a vLLM engine-args help text (no --max-num-seqs / --tensor-parallel-size); "
                         "run `vllm serve --help=all` by hand to see what the engine prints")
    if SPEC_FLAG in flags and AR_FLAG in flags and BUFFER_FLAG in flags:
        return Dialect("fork", flags)
    if AR_FLAG in flags:
        return Dialect("upstream", flags)
    return Dialect("none", flags)


def parse_version(text: str) -> str | None:
    """`vllm --version` prints the bare version ("0.31.0", "0.11.1rc2.dev5+g1a2b3c"); the first match wins."""
    for line in (text or "").splitlines():
        m = _VERSION.search(line.strip())
        if m:
            return m.group(1)
    return None


# The dialect assumed when no engine is installed, so that a skipped row still shows the exact commands
# a user of the official fork would run.
ASSUMED = Dialect("fork", frozenset({AR_FLAG, SPEC_FLAG, BUFFER_FLAG, ROUTE_FLAG, "--mamba-cache-mode",
                                     "--no-enable-prefix-caching", "--speculative-config"}))
