"""tree_accept and compact_kv on CPU: greedy paths exactly, the sampled walk by its distribution."""

import pytest
import torch

import plugins
from tests.plugins.oracles import _p_value, sorted_filter_probs
from tests.plugins.test_reference import argmax_drafts_missing_at, logits_with_argmax, sampling


def greedy_tree(tokens, parents, num_nodes, logits):
    B = tokens.shape[0]
    T, tk, tp, seeds = sampling(B, temperature=0.0)
    return plugins.tree_accept(tokens, parents, num_nodes, logits, None, T, tk, tp, seeds)


def test_a_chain_tree_is_greedy_accept():
    logits, drafts = argmax_drafts_missing_at(5, 3, 11, misses=[(1, 2), (2, 0)])
    num = torch.tensor([3, 3, 3, 1, 0])
    tokens = torch.cat([torch.zeros(5, 1, dtype=torch.long), drafts], 1)
    parents = torch.tensor([[-1, 0, 1, 2]] * 5)
    n, nxt, path = greedy_tree(tokens, parents, num + 1, logits)
    want = plugins.greedy_accept(drafts, num, logits)
    assert n.tolist() == want[0].tolist() and nxt.tolist() == want[1].tolist()
    assert (
        path[0].tolist() == [0, 1, 2, 3] and path[1].tolist() == [0, 1, 2, -1] and path[2].tolist() == [0, -1, -1, -1]
    )


def test_a_tree_of_one_node_commits_the_roots_argmax():
    logits = logits_with_argmax([[7, 1, 1]], 9)
    n, nxt, path = greedy_tree(torch.tensor([[3, 7, 1]]), torch.tensor([[-1, 0, 1]]), torch.tensor([1]), logits)
    assert n.tolist() == [0] and nxt.tolist() == [7] and path.tolist() == [[0, -1, -1]]


def test_greedy_takes_the_deepest_accepted_branch():
    # root → {1: token 4 (right), 2: token 5 (wrong), 3: token 4 (right, duplicate)}; 1 → {4: 6 wrong};
    # 3 → {5: 6 right} → {6: 2 right}: the branch through node 3 is deeper
    tokens = torch.tensor([[0, 4, 5, 4, 6, 6, 2]])
    parents = torch.tensor([[-1, 0, 0, 0, 1, 3, 5]])
    argmax = [[4, 7, 0, 6, 0, 2, 8]]  # after node i the target wants argmax[i]
    n, nxt, path = greedy_tree(tokens, parents, torch.tensor([7]), logits_with_argmax(argmax, 10))
    assert n.tolist() == [3] and nxt.tolist() == [8] and path.tolist() == [[0, 3, 5, 6, -1, -1, -1]]


def test_full_branching_finds_the_one_right_child_at_each_level():
    V = 6  # root has all V tokens as children; the right one (3) has all V tokens as children
    tokens = torch.tensor([[0] + list(range(V)) + list(range(V))])
    parents = torch.tensor([[-1] + [0] * V + [1 + 3] * V])
    argmax = [[3] + [0] * V + [5] * V]
    argmax[0][1 + 3] = 2
    n, nxt, path = greedy_tree(tokens, parents, torch.tensor([1 + 2 * V]), logits_with_argmax(argmax, V))
    assert n.tolist() == [2] and path[0, :3].tolist() == [0, 4, 1 + V + 2] and nxt.tolist() == [5]


def test_padding_nodes_past_num_nodes_are_ignored():
    logits = logits_with_argmax([[4, 5, 6]], 8)
    n, _, _ = greedy_tree(torch.tensor([[0, 4, 5]]), torch.tensor([[-1, 0, 1]]), torch.tensor([2]), logits)
    assert n.tolist() == [1]


@pytest.mark.parametrize("with_q", [False, True], ids=["deterministic-children", "sampled-children"])
def test_the_sampled_walk_commits_the_target_distribution(with_q):
    rows, V = 4000, 5
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(1, 4, V, generator=g) * 1.5).expand(rows, 4, V).contiguous()
    # root → children 1, 2, 3 (three guesses for the first token)
    parents = torch.tensor([[-1, 0, 0, 0]]).expand(rows, 4)
    p = sorted_filter_probs(logits[:1], torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1))[0]
    if with_q:
        q = torch.softmax(torch.randn(V, generator=g), -1)
        children = torch.multinomial(q.repeat(rows, 1), 3, replacement=True, generator=g)
        draft_probs = q.expand(rows, 4, V).contiguous()
    else:
        children = torch.tensor([[4, 0, 2]]).expand(rows, 3)
        draft_probs = None
    tokens = torch.cat([torch.zeros(rows, 1, dtype=torch.long), children], 1)
    T, tk, tp, seeds = sampling(rows, seed=11)
    n, nxt, path = plugins.tree_accept(tokens, parents, torch.full((rows,), 4), logits, draft_probs, T, tk, tp, seeds)
    assert set(n.tolist()) <= {0, 1}
    first = torch.where(n > 0, tokens.gather(1, path[:, 1:2].clamp(min=0)).squeeze(1), nxt)
    assert _p_value(first, p[0]) > 1e-3
    # the accepted child's own next token follows the target after that child
    via_node_1 = (n == 1) & (path[:, 1] == 1)
    assert int(via_node_1.sum()) > 200 and _p_value(nxt[via_node_1], p[1]) > 1e-3


def test_compact_kv_moves_the_accepted_nodes_behind_the_prefix():
    L, B, H, S, D = 2, 3, 2, 12, 4
    cache = torch.arange(L * B * H * S * D, dtype=torch.float32).view(L, B, H, S, D)
    before = cache.clone()
    start = torch.tensor([2, 0, 5])
    path = torch.tensor([[0, 3, 5, -1], [0, 1, 2, 3], [0, -1, -1, -1]])
    num = torch.tensor([2, 3, 0])
    plugins.compact_kv(cache, start, path, num)
    assert torch.equal(cache[:, 0, :, 3], before[:, 0, :, 5]) and torch.equal(cache[:, 0, :, 4], before[:, 0, :, 7])
    assert torch.equal(cache[:, 1], before[:, 1]) and torch.equal(cache[:, 2], before[:, 2])
    untouched = torch.ones(S, dtype=torch.bool)
    untouched[[3, 4]] = False
    assert torch.equal(cache[:, 0, :, untouched], before[:, 0, :, untouched])


def test_tree_inputs_are_checked():
    logits = torch.randn(1, 3, 5)
    with pytest.raises(ValueError, match="parents must list each node after its parent"):
        greedy_tree(torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 2, 0]]), torch.tensor([3]), logits)
    with pytest.raises(ValueError, match=r"num_nodes must be in \[1, 3\]"):
        greedy_tree(torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 0, 1]]), torch.tensor([4]), logits)
