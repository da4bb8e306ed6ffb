"""How waiting prompts are grouped into prefill forwards: the engine's prefill planning, apart from its round.

Prompts of adjacent slots prefill together, right-padded to the longest; a batch of one long and many short prompts
would pad every short one to the long one's width, so runs are cut where another forward costs less than the
padding (`split_padded_batch`). Pure functions over prompt lengths and slots: the engine applies them.
"""

from __future__ import annotations

#: what one more prefill forward costs, in padded tokens: its fixed part (reading every weight once, ~40 ms for the
#: default target in fp32 on one CPU core) against ~6 ms per prompt token. On a GPU the fixed part weighs more and a
#: padded token less, so this bound cuts more often than the optimum there: at worst one more small forward per cut.
PREFILL_FORWARD_COST_TOKENS = 32


def split_padded_batch(lengths: list[int], forward_cost: int = PREFILL_FORWARD_COST_TOKENS) -> list[tuple[int, int]]:
    """Cut prompts of adjacent slots into contiguous runs `[a, b)` minimising Σ forward_cost + (b - a) × the run's
    longest prompt: one batch of a 449-token and nineteen 100-token prompts pads 20 × 449 tokens, two batches
    449 + 19 × 100. Exact, by dynamic programming over at most max_batch_size rows."""
    best, cut = [0.0] + [float("inf")] * len(lengths), [0] * (len(lengths) + 1)  # best[j]: the first j prompts
    for j in range(1, len(lengths) + 1):
        width = 0
        for i in range(j - 1, -1, -1):  # the last run is [i, j)
            width = max(width, lengths[i])
            if best[i] + forward_cost + width * (j - i) < best[j]:
                best[j], cut[j] = best[i] + forward_cost + width * (j - i), i
    runs, j = [], len(lengths)
    while j:
        runs.append((cut[j], j))
        j = cut[j]
    return runs[::-1]


def prefill_runs(waiting: list[tuple[int, int, int]]) -> list[list[int]]:
    """waiting [(slot, prefill position, prompt tokens left)] in slot order → the prefill groups, each a list of
    indices into `waiting`: runs of adjacent slots at the same prefill position (normally one run: new requests are
    appended at the end), each cut where right-padding its prompts to one width would cost more than another forward."""
    runs: list[list[int]] = []
    for i, (slot, position, _) in enumerate(waiting):
        last = waiting[runs[-1][-1]] if runs else None
        if last is not None and last[0] == slot - 1 and last[1] == position:
            runs[-1].append(i)
        else:
            runs.append([i])
    return [run[a:b] for run in runs for a, b in split_padded_batch([waiting[i][2] for i in run])]
