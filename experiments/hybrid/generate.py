"""Greedy generation through a HybridModel: plain AR decoding, and a real draft / verify / commit loop.

    ar = greedy_ar(model, token, n)                                   # [batch, n] tokens
    sp = greedy_speculative(model, drafter, token, hidden, n, T)      # [batch, n] tokens, accepted counts

Greedy acceptance: draft i is accepted while it equals the model's own argmax at the position before it, so
accepted = 1 + leading matches (the bonus token included, vLLM's convention) and the emitted tokens are the
verify step's argmax over the accepted prefix: exactly what AR decoding emits, whatever the drafter proposes.
`drafter(token [batch], hidden [batch, d], n) -> [batch, n]` (MTPDrafter.draft, or any proposal);
`on_commit(accepted)` runs after each commit (e.g. MTPDrafter.sync_lengths).
"""

from __future__ import annotations

import torch

from experiments.hybrid.model import HybridModel


def greedy_ar(model: HybridModel, token: torch.Tensor, n: int) -> torch.Tensor:
    out = []
    for _ in range(n):
        logits, _ = model.decode(token)
        token = logits.argmax(-1)
        out.append(token)
    return torch.stack(out, dim=1)


def accept_greedy(drafts: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """drafts [batch, T-1], target argmax [batch, T] -> accepted int32 [batch] in 1..T."""
    match = (drafts == target[:, :-1]).to(torch.int32)
    return (1 + torch.cumprod(match, dim=1).sum(dim=1)).to(torch.int32)


def greedy_speculative(model: HybridModel, drafter, token: torch.Tensor, hidden: torch.Tensor, n: int, T: int,
                       on_commit=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run verify + commit windows of T tokens until every row has emitted n tokens."""
    b = token.shape[0]
    emitted = [[] for _ in range(b)]
    history = []
    while min(len(e) for e in emitted) < n:
        drafts = drafter(token, hidden, T - 1)
        logits, h = model.forward(torch.cat([token[:, None], drafts], dim=1))
        target = logits.argmax(-1)
        accepted = accept_greedy(drafts, target)
        model.advance(accepted, T)
        if on_commit is not None:
            on_commit(accepted)
        history.append(accepted)
        rows = torch.arange(b, device=token.device)
        last = accepted.long() - 1
        token, hidden = target[rows, last], h[rows, last]
        for r, a in enumerate(accepted.tolist()):
            emitted[r].extend(target[r, :a].tolist())
    return torch.tensor([e[:n] for e in emitted], device=token.device), history
