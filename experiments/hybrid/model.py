"""HybridModel: embedding -> pre-norm residual sub-layers (the pattern) -> final norm -> LM head.

    model = HybridModel(spec, ssm_method="replay_ar", call=SSMCall(...), num_slots=8, capacity=1088, ...)
    model.reset(context=1024)                  # random prefill: KV for 1024 tokens, SSM / conv states
    logits, hidden = model.forward(tokens)     # tokens [batch, T] -> logits [batch, T, vocab], hidden [batch, T, d]
    model.advance(accepted)                    # commit `accepted` [batch] tokens (AR: model.decode does it)

`build="block"` builds one sub-layer per kind (HybridSpec.block) instead of the whole pattern: the
composed step (spec.composition()). `profile=True` times every sub-layer with a device sync around it into
`self.kind_us` (per pattern character, and "other" for embedding + final norm + LM head); the timed steps
of the experiments run with profile=False, the SSM share comes from a separate profiled pass.

MTPDrafter: one MTP module at the model's dims (DeepSeek-V3 / Nemotron-H style): eh_proj over
[norm(embed(token)), norm(hidden)], the model's `mtp_pattern` sub-layers, then the shared LM head.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from experiments.hybrid.layers import MLP, Attention, MoE, SSMCall, SSMMixer, _w, rms_norm
from experiments.hybrid.mla import MLAAttention
from experiments.hybrid.spec import SSM_CHAR, SSM_KINDS, HybridSpec
from replayssm.ring_cursors import DecodeCursor, SpecCursor


def _shared_cursor(method: str, call: SSMCall, num_slots: int, device: str):
    """A DecodeCursor (replay_ar) or SpecCursor (replay_spec) for every SSM layer of a model, else None."""
    if method == "replay_ar":
        return DecodeCursor.allocate(num_slots, call.buffer_len, device)
    if method == "replay_spec":
        return SpecCursor.allocate(num_slots, call.history_len, call.spec_T, device)
    return None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class HybridModel:
    def __init__(self, spec: HybridSpec, *, ssm_method: str, call: SSMCall, num_slots: int, capacity: int,
                 gen: torch.Generator, device: str, build: str = "full", moe_impl: str = "auto",
                 pattern: tuple[str, ...] | None = None, shared: HybridModel | None = None):
        if build not in ("full", "block"):
            raise ValueError(f"build: expected full or block, got {build!r}")
        self.spec, self.call, self.device, self.build = spec, call, device, build
        self.num_slots, self.capacity = num_slots, capacity
        act, d = call.act_dtype, spec.hidden
        if shared is None:
            self.embed = _w(gen, spec.vocab, d, fan_in=1, dtype=act, device=device)
            self.head = _w(gen, spec.vocab, d, fan_in=d, dtype=act, device=device)
        else:                                                   # the MTP drafter shares embedding and head
            self.embed, self.head = shared.embed, shared.head
        self.final_norm = torch.ones(d, dtype=act, device=device)
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.bound = [0]                                        # host-side max of lengths (never synced)
        pattern = pattern if pattern is not None else (spec.block() if build == "block" else spec.pattern)
        self.pattern = pattern
        self.layers = []
        # ReplaySSM keeps one cursor per row for all its layers, moved once per step (replayssm/ring_cursors.py)
        self.ssm_cursor = _shared_cursor(ssm_method, call, num_slots, device)
        for ch in pattern:
            if ch in SSM_KINDS:
                layer = SSMMixer(spec, ssm_method, call, num_slots, gen, device, cursor=self.ssm_cursor)
            elif ch == "*":
                cls = MLAAttention if spec.attention.kind == "mla" else Attention
                layer = cls(spec, num_slots, capacity, self.lengths, self.bound, gen, act, device)
            elif ch == "-":
                layer = MLP(spec, gen, act, device)
            else:
                layer = MoE(spec, gen, act, device, impl=moe_impl)
            self.layers.append((ch, torch.ones(d, dtype=act, device=device), layer))
        self.moe_impl = next((lay.impl for ch, _, lay in self.layers if ch == "E"), None)
        self.profile = False
        self.kind_us: dict[str, float] = defaultdict(float)
        self.phase = ""                                         # the serving phase being profiled (run.py)
        self.phase_kind_us: dict[tuple[str, str], float] = defaultdict(float)

    # ------------------------------------------------------------------------------------------- state
    def reset(self, context: int, gen: torch.Generator) -> None:
        """Every row at `context` tokens of random prefill (KV entries, SSM and conv states)."""
        if context + 1 > self.capacity:
            raise ValueError(f"context_len={context} does not fit the KV capacity {self.capacity}")
        self.set_lengths(context)
        for ch, _, layer in self.layers:
            if ch == "*":
                layer.reset(gen, context)
            elif ch in SSM_KINDS:
                layer.reset(gen)

    def set_lengths(self, context: int) -> None:
        self.lengths.fill_(context)
        self.bound[0] = context

    def cache_bytes(self) -> dict[str, int]:
        """Allocated persistent bytes: KV cache, SSM caches (states, buffers/rings, cursors) + conv states."""
        kv = sum(lay.nbytes() for ch, _, lay in self.layers if ch == "*")
        ssm = sum(lay.nbytes() for ch, _, lay in self.layers if ch in SSM_KINDS)
        return {"kv": kv, "ssm": ssm}

    def weight_bytes(self) -> int:
        own = self.final_norm.numel() * self.final_norm.element_size() * (1 + len(self.layers))
        return own + sum(lay.weight_bytes() for _, _, lay in self.layers)

    def embed_head_bytes(self) -> int:
        return 2 * self.embed.numel() * self.embed.element_size()

    # ------------------------------------------------------------------------------------------- steps
    def _timed(self, kind: str, fn, *args):
        if not self.profile:
            return fn(*args)
        _sync(self.device)
        t0 = time.perf_counter()
        out = fn(*args)
        _sync(self.device)
        us = (time.perf_counter() - t0) * 1e6
        self.kind_us[kind] += us
        self.phase_kind_us[(self.phase, kind)] += us
        return out

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._timed("other", F.embedding, tokens, self.embed)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self._timed("other", lambda x: F.linear(rms_norm(x, self.final_norm), self.head), h)

    def run_layers(self, h: torch.Tensor) -> torch.Tensor:
        for ch, norm_w, layer in self.layers:
            h = h + self._timed(ch, lambda x, lay=layer, w=norm_w: lay(rms_norm(x, w)), h)
        return h

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens int64 [batch, T] -> (logits [batch, T, vocab], final hidden [batch, T, hidden])."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected [batch, T], got shape {tuple(tokens.shape)}")
        if self.bound[0] + tokens.shape[1] > self.capacity:
            raise ValueError(f"KV capacity {self.capacity} exceeded: length {self.bound[0]} + window {tokens.shape[1]}")
        h = self.run_layers(self.embed_tokens(tokens))
        return self.logits(h), h

    def advance(self, accepted: torch.Tensor, max_accepted: int) -> None:
        """Commit `accepted` [batch] tokens of the last window in every layer; KV cursor += accepted.
        `max_accepted` (host int, >= every entry) keeps the host-side bound without a device sync."""
        for ch, _, layer in self.layers:
            if ch in SSM_KINDS:
                self._timed(ch, layer.advance, accepted)
        if self.ssm_cursor is not None:
            self._timed(SSM_CHAR[self.spec.family], self._move_cursor, accepted)
        self.lengths[: accepted.shape[0]] += accepted.to(self.lengths.dtype)
        self.bound[0] += max_accepted

    def decode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One AR decode step: tokens [batch] -> (logits [batch, vocab], hidden [batch, hidden])."""
        logits, h = self.forward(tokens[:, None])
        self.advance(self._ones(tokens.shape[0]), 1)
        return logits[:, 0], h[:, 0]

    def _move_cursor(self, accepted: torch.Tensor) -> None:
        """The shared SSM cursor, once per step for every layer: AR advance or the spec ring's commit."""
        slots = torch.arange(accepted.shape[0], dtype=torch.int32, device=accepted.device)
        if isinstance(self.ssm_cursor, DecodeCursor):
            self.ssm_cursor.advance(slots, backend=self.call.backend)
        else:
            self.ssm_cursor.commit(accepted.to(torch.int32), slots, backend=self.call.backend)

    def _ones(self, b: int) -> torch.Tensor:
        if getattr(self, "_ones_cache", None) is None or self._ones_cache.shape[0] != b:
            self._ones_cache = torch.ones(b, dtype=torch.int32, device=self.device)
        return self._ones_cache


class MTPDrafter:
    """One MTP module: drafts n tokens greedily, one at a time, from (last token, last hidden)."""

    def __init__(self, model: HybridModel, gen: torch.Generator, capacity: int):
        spec, call = model.spec, model.call
        d = spec.hidden
        self.model = model
        self.eh_proj = _w(gen, d, 2 * d, fan_in=2 * d, dtype=call.act_dtype, device=model.device)
        self.enorm = torch.ones(d, dtype=call.act_dtype, device=model.device)
        self.hnorm = torch.ones(d, dtype=call.act_dtype, device=model.device)
        self.mtp = HybridModel(spec, ssm_method="baseline_ar", call=call, num_slots=model.num_slots,
                               capacity=capacity, gen=gen, device=model.device, pattern=spec.mtp_pattern,
                               shared=model)

    def weight_bytes(self) -> int:
        return self.mtp.weight_bytes() + self.eh_proj.numel() * self.eh_proj.element_size()

    def reset(self, context: int, gen: torch.Generator) -> None:
        self.mtp.reset(context, gen)

    def sync_lengths(self) -> None:
        """After a commit the drafter's KV cursor follows the model's (its draft entries past it are stale)."""
        self.mtp.lengths.copy_(self.model.lengths)
        self.mtp.bound[0] = self.model.bound[0]

    def draft(self, token: torch.Tensor, hidden: torch.Tensor, n: int) -> torch.Tensor:
        """token [batch], hidden [batch, d] -> drafts int64 [batch, n]; the drafter's cursor is restored."""
        out = []
        bound = self.mtp.bound[0]
        for _ in range(n):
            e = rms_norm(self.mtp.embed_tokens(token[:, None]), self.enorm)
            x = F.linear(torch.cat([e, rms_norm(hidden[:, None], self.hnorm)], dim=-1), self.eh_proj)
            h = self.mtp.run_layers(x)
            token = self.mtp.logits(h)[:, 0].argmax(-1)
            hidden = h[:, 0]
            out.append(token)
            self.mtp.lengths += 1
            self.mtp.bound[0] += 1
        self.mtp.lengths -= n
        self.mtp.bound[0] = bound
        return torch.stack(out, dim=1)
