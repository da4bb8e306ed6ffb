"""Every Triton kernel under TRITON_INTERPRET=1 (on CPU) against the CPU reference: the same inputs, the same
seeds, the same outputs. Sizes stay tiny: the interpreter runs each program in Python."""

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated: before plugins.kernels is imported
triton = pytest.importorskip("triton")
triton.knobs.runtime.interpret = True  # in case triton was imported (and read the variable) earlier

from plugins import reference  # noqa: E402  (after TRITON_INTERPRET is set)
from plugins.kernels import launch  # noqa: E402  (after TRITON_INTERPRET is set)
from tests.plugins.oracles import step_p_values  # noqa: E402  (after TRITON_INTERPRET is set)


def _same(got, want):
    assert len(got) == len(want), f"{len(got)} outputs, the reference has {len(want)}"
    for g, w in zip(got, want):
        assert g.tolist() == w.tolist()


def _case(B=5, k=3, V=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, k + 1, V, generator=g) * 2
    drafts = logits[:, :k].argmax(-1)
    if k >= 2:
        drafts[1, 1] = (drafts[1, 1] + 1) % V  # row 1 rejects at slot 1, row 2 has one draft, row 3 none
        drafts[4, 0] = (drafts[4, 0] + 1) % V  # row 4 rejects at once
    num = torch.tensor([k, k, min(k, 1), 0, k])[:B]
    return drafts, num, logits


def test_greedy_accept_edges():
    _same(launch.greedy_accept(*_case()), reference.greedy_accept(*_case()))
    drafts, num, logits = _case(k=0)
    _same(launch.greedy_accept(drafts, num, logits), reference.greedy_accept(drafts, num, logits))
    logits = torch.zeros(2, 3, 6)
    logits[:, :, 1] = logits[:, :, 4] = 1.0  # ties: the lowest id
    args = (torch.tensor([[1, 4], [1, 1]]), torch.tensor([2, 2]), logits)
    _same(launch.greedy_accept(*args), reference.greedy_accept(*args))
    args = (torch.zeros(2, 2, dtype=torch.long), torch.tensor([2, 1]), torch.randn(2, 3, 1))  # V = 1
    _same(launch.greedy_accept(*args), reference.greedy_accept(*args))


def test_greedy_accept_over_several_vocabulary_blocks(monkeypatch):
    monkeypatch.setattr(launch, "MAX_BLOCK_V", 16)
    _same(launch.greedy_accept(*_case(V=50)), reference.greedy_accept(*_case(V=50)))


def _sampling(B, temperature, top_k, top_p):
    return (
        torch.tensor(temperature, dtype=torch.float32),
        torch.tensor(top_k),
        torch.tensor(top_p, dtype=torch.float32),
        torch.arange(B, dtype=torch.long) * 7919,
    )


@pytest.mark.parametrize("with_q", [False, True], ids=["one-hot-q", "q"])
def test_rejection_sample_equals_the_reference(with_q):
    drafts, num, logits = _case()
    q = torch.softmax(torch.randn(5, 3, 37, generator=torch.Generator().manual_seed(1)), -1) if with_q else None
    # greedy, plain, top-k, top-p, both
    sampling = _sampling(5, [0.0, 1.0, 0.7, 1.0, 1.3], [0, 0, 5, 0, 8], [1.0, 1.0, 1.0, 0.8, 0.9])
    _same(
        launch.rejection_sample(drafts, num, logits, q, *sampling),
        reference.rejection_sample(drafts, num, logits, q, *sampling),
    )


def test_rejection_sample_all_accepted_with_eos_inside_and_one_token_vocabulary():
    V = 8
    logits = torch.full((2, 4, V), -4.0)
    logits[:, :, 2] = 4.0  # the target is nearly sure of token 2 (say EOS) at every slot
    drafts = torch.full((2, 3), 2)
    sampling = _sampling(2, [1.0, 1.0], [0, 0], [1.0, 1.0])
    got = launch.rejection_sample(drafts, torch.tensor([3, 2]), logits, None, *sampling)
    _same(got, reference.rejection_sample(drafts, torch.tensor([3, 2]), logits, None, *sampling))
    args = (
        torch.zeros(2, 2, dtype=torch.long),
        torch.tensor([2, 1]),
        torch.randn(2, 3, 1),
        None,
        *_sampling(2, [1.0, 0.5], [0, 0], [1.0, 0.5]),
    )
    _same(launch.rejection_sample(*args), reference.rejection_sample(*args))


def test_rejection_sample_kernel_commits_the_target_distribution():
    # small (the interpreter runs each row in Python): the kernel equals the reference above, whose own
    # distribution test has the full size and a negative control
    p0, _ = step_p_values(launch.rejection_sample, rows=200, V=3, k=1, with_q=True)
    assert p0 > 1e-3


def test_process_logits_equals_the_reference():
    logits = torch.randn(3, 2, 29, generator=torch.Generator().manual_seed(2)) * 2
    sampling = _sampling(3, [0.0, 0.8, 1.1], [0, 4, 10], [1.0, 1.0, 0.7])[:3]
    torch.testing.assert_close(launch.process_logits(logits, *sampling), reference.process_logits(logits, *sampling))


def test_confidence_truncate_equals_the_reference():
    conf = torch.tensor([[0.9, 0.9, 0.5, 0.9], [0.4, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    num = torch.tensor([4, 4, 2])
    got, want = launch.confidence_truncate(conf, num, 0.5), reference.confidence_truncate(conf, num, 0.5)
    assert got[0].tolist() == want[0].tolist()
    torch.testing.assert_close(got[1], want[1])


def test_greedy_tree_accept_equals_the_reference():
    V = 6  # full branching under the root, a chain under its right child, one row that is a single node
    tokens = torch.tensor([[0, 0, 1, 2, 3, 4, 5, 1, 2], [0, 3, 1, 1, 0, 0, 0, 0, 0]])
    parents = torch.tensor([[-1, 0, 0, 0, 0, 0, 0, 4, 7], [-1, 0, 1, 2, 0, 0, 0, 0, 0]])
    logits = torch.randn(2, 9, V, generator=torch.Generator().manual_seed(4))
    logits[0, 0, 3], logits[0, 4, 1], logits[0, 7, 5] = 9.0, 9.0, 9.0  # root wants 3 (node 4), then 1 (node 7)
    num_nodes = torch.tensor([9, 1])
    sampling = _sampling(2, [0.0, 0.0], [0, 0], [1.0, 1.0])
    got = launch.tree_accept(tokens, parents, num_nodes, logits, None, *sampling)
    _same(got, reference.tree_accept(tokens, parents, num_nodes, logits, None, *sampling))
    assert got[0].tolist() == [2, 0]


def _random_trees(B, N, V, seed, with_q):
    """Random topological trees (parents[i] < i), uneven num_nodes, greedy and sampled rows with every filter."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.stack(
        [torch.tensor([-1] + [int(torch.randint(i, (1,), generator=g)) for i in range(1, N)]) for _ in range(B)]
    )
    logits = torch.randn(B, N, V, generator=g) * 2
    q = torch.softmax(torch.randn(B, N, V, generator=g) * 2, -1) if with_q else None
    tokens = (
        torch.randint(V, (B, N), generator=g)
        if q is None
        else torch.multinomial(q.view(B * N, V), 1, generator=g).view(B, N)
    )
    tokens[:, 1] = logits[:, 0].argmax(-1)  # the first child is often accepted, so walks go deep
    num_nodes = torch.randint(1, N + 1, (B,), generator=g)
    num_nodes[0] = N
    T = torch.tensor([0.0, 1.0, 0.7, 1.0, 1.3, 1.0, 2.0, 0.5])[:B]
    top_k = torch.tensor([0, 0, 3, 0, 4, 0, 0, 2])[:B]
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.8, 0.9, 1.0, 0.6, 1.0])[:B]
    return tokens, parents, num_nodes, logits, q, T, top_k, top_p, torch.arange(B, dtype=torch.long) * 7919 + seed


@pytest.mark.parametrize("with_q, seed", [(False, 0), (True, 1)], ids=["one-hot-q", "q"])
def test_sampled_tree_accept_equals_the_reference(with_q, seed):
    args = _random_trees(8, 7, 9, seed, with_q)
    _same(launch.tree_accept(*args), reference.tree_accept(*args))


@pytest.mark.parametrize("with_q", [False, True], ids=["one-hot-q", "q"])
def test_sampled_tree_walk_through_full_branching_replays_every_residual(with_q):
    V = 5  # the root's children are the whole vocabulary, so a walk rejects several siblings before one holds
    B, N = 8, 1 + V + 2
    tokens = torch.tensor([[0] + list(range(V)) + [1, 2]] * B)
    parents = torch.tensor([[-1] + [0] * V + [3, 3]] * B)
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(B, N, V, generator=g)
    logits[:, 0, 3] += 2.0  # most mass on a later sibling: the walk gets there after rejecting 0, 1, 2
    q = torch.softmax(torch.randn(B, N, V, generator=g), -1) if with_q else None
    args = (
        tokens,
        parents,
        torch.full((B,), N),
        logits,
        q,
        torch.ones(B),
        torch.zeros(B, dtype=torch.long),
        torch.ones(B),
        torch.arange(B, dtype=torch.long) * 31 + 3,
    )
    got = launch.tree_accept(*args)
    _same(got, reference.tree_accept(*args))
    assert int((got[2][:, 1] > 1).sum()) > 0, "no row accepted a sibling after rejecting an earlier one"


def test_sampled_tree_edges_one_node_one_token_vocabulary_and_zeros_in_q():
    sampled = (torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2), torch.tensor([4, 9]))
    one_node = (torch.tensor([[5], [2]]), torch.tensor([[-1], [-1]]), torch.tensor([1, 1]), torch.randn(2, 1, 7))
    for q in (None, torch.softmax(torch.randn(2, 1, 7), -1)):
        got = launch.tree_accept(*one_node, q, *sampled)
        _same(got, reference.tree_accept(*one_node, q, *sampled))
        assert got[0].tolist() == [0, 0] and got[2].tolist() == [[0], [0]]
    v1 = (
        torch.zeros(2, 4, dtype=torch.long),
        torch.tensor([[-1, 0, 1, 1]] * 2),
        torch.tensor([4, 3]),
        torch.randn(2, 4, 1),
    )
    for q in (None, torch.ones(2, 4, 1)):
        got = launch.tree_accept(*v1, q, *sampled)
        _same(got, reference.tree_accept(*v1, q, *sampled))
        assert got[0].tolist() == [2, 2] and got[1].tolist() == [0, 0]  # V = 1: every draft is the only token
    # q with zeros: a child whose own q is 0 at its token is never accepted; zeros elsewhere shape the residual
    V = 6
    logits = torch.zeros(2, 4, V)
    logits[:, 0, 2] = 3.0
    q = torch.zeros(2, 4, V)
    q[:, 1, 2] = 0.0
    q[:, 1, 0] = 1.0  # node 1 (token 2) has q(2) = 0: rejected, and its q takes nothing from the target's token 2
    q[:, 2, 2], q[:, 2, 4] = 0.5, 0.5
    q[:, 3, :] = 1.0 / V
    tokens = torch.tensor([[0, 2, 2, 4], [0, 2, 4, 2]])
    parents = torch.tensor([[-1, 0, 0, 0]] * 2)
    args = (tokens, parents, torch.tensor([4, 4]), logits, q, *sampled)
    got = launch.tree_accept(*args)
    _same(got, reference.tree_accept(*args))
    assert got[2][:, 1].tolist() != [1, 1]


def test_tree_accept_over_several_vocabulary_blocks(monkeypatch):
    monkeypatch.setattr(launch, "MAX_BLOCK_V", 16)
    args = _random_trees(4, 6, 40, 3, True)
    _same(launch.tree_accept(*args), reference.tree_accept(*args))


def test_compact_kv_equals_the_reference():
    cache = torch.randn(2, 3, 2, 12, 4)
    start, path, num = (
        torch.tensor([2, 0, 5]),
        torch.tensor([[0, 3, 5, -1], [0, 1, 2, 3], [0, -1, -1, -1]]),
        torch.tensor([2, 3, 0]),
    )
    want = cache.clone()
    reference.compact_kv(want, start, path, num)
    launch.compact_kv(cache, start, path, num)
    assert torch.equal(cache, want)


@pytest.mark.parametrize("D", [3, 80], ids=["small-head", "head-over-two-tiles"])
def test_out_of_place_compact_kv_equals_the_reference_and_leaves_its_input(D):
    cache = torch.randn(2, 3, 2, 37, D)  # S spans several BLOCK_S tiles; D is not a power of two
    start, path, num = (
        torch.tensor([2, 0, 30]),
        torch.tensor([[0, 3, 5, -1], [0, 1, 2, 3], [0, 2, 3, -1]]),
        torch.tensor([2, 3, 2]),
    )
    before = cache.clone()
    want = cache.clone()
    reference.compact_kv(want, start, path, num)
    got = launch.compact_kv_out(cache, start, path, num)
    assert torch.equal(got, want) and torch.equal(cache, before)


# ---- the kernels as the ahead-of-time build sizes them (plugins.aot) -------------------------------------------
def _deep_trees(N, V=7):
    """Row 0 a greedy chain of N nodes that the target accepts to its end (the deepest walk there is), row 1 a
    random sampled tree."""
    tokens, parents, num_nodes, logits, q, T, top_k, top_p, seeds = _random_trees(2, N, V, 5, False)
    parents[0] = torch.arange(N) - 1
    tokens[0, 1:] = logits[0, :-1].argmax(-1)
    num_nodes[:] = N
    return tokens, parents, num_nodes, logits, q, T, top_k, top_p, seeds


def _aot_lanes(size, blocks):
    from plugins.aot import aot_block

    return aot_block(size, blocks, "test", "lanes")


@pytest.mark.parametrize("num_nodes", [64, 65])
def test_tree_accept_built_for_its_aot_size_equals_the_reference(num_nodes):
    """The kernel with the lanes the AOT build gives a tree of num_nodes (64 lanes at 64 nodes, the next size at
    65): the chain row is accepted to its last node, as in the reference."""
    from plugins.aot import AOT_NODE_BLOCKS

    args = _deep_trees(num_nodes)
    got = launch.tree_accept(*args, block_n=_aot_lanes(num_nodes, AOT_NODE_BLOCKS))
    _same(got, reference.tree_accept(*args))
    assert int(got[0][0]) == num_nodes - 1


def test_a_tree_kernel_with_fewer_lanes_than_nodes_is_wrong():
    """Negative control, and why a plugin refuses a tree larger than its largest build: 64 lanes on a 65-node chain
    never see the last node."""
    args = _deep_trees(65)
    assert int(reference.tree_accept(*args)[0][0]) == 64
    assert int(launch.tree_accept(*args, block_n=64)[0][0]) != 64


@pytest.mark.parametrize("num_slots", [16, 17])
def test_confidence_truncate_built_for_its_aot_size_equals_the_reference(num_slots):
    from plugins.aot import AOT_SLOT_BLOCKS

    conf = torch.ones(2, num_slots)
    conf[1, -1] = 0.1  # row 1 cuts at its last slot
    num = torch.full((2,), num_slots)
    got = launch.confidence_truncate(conf, num, 0.5, block_k=_aot_lanes(num_slots, AOT_SLOT_BLOCKS))
    want = reference.confidence_truncate(conf, num, 0.5)
    assert got[0].tolist() == want[0].tolist() == [num_slots, num_slots - 1]
    torch.testing.assert_close(got[1], want[1])
