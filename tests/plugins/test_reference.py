"""The CPU reference ops (torch.ops.deepspec.* on CPU): exact results for greedy, distributions for sampling."""

import pytest
import torch

import plugins
from plugins import reference
from plugins.reference.accept import on_host
from tests.plugins.oracles import accept_everything, sorted_filter_probs, step_p_values


def logits_with_argmax(argmax: list[list[int]], V: int) -> torch.Tensor:
    """[B, T, V] logits whose argmax at each position is the given token (vLLM's create_logits_tensor)."""
    x = torch.zeros(len(argmax), len(argmax[0]), V)
    x.scatter_(2, torch.tensor(argmax)[..., None], 5.0)
    return x


def argmax_drafts_missing_at(B: int, k: int, V: int, misses: list[tuple[int, int]]):
    """Seeded [B, k+1, V] logits and [B, k] drafts equal to their argmax except at each (row, position) in `misses`,
    where the draft is the next token id: greedy acceptance keeps a row's drafts up to its first miss."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, k + 1, V, generator=g)
    drafts = logits[:, :k].argmax(-1)
    for row, position in misses:
        drafts[row, position] = (drafts[row, position] + 1) % V
    return logits, drafts


def sampling(B, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    return (
        torch.full((B,), temperature),
        torch.full((B,), top_k, dtype=torch.long),
        torch.full((B,), top_p),
        torch.arange(B, dtype=torch.long) + seed,
    )


# ---- logits processing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.9), (1.3, 50, 0.6), (1.0, 1, 1.0), (0.5, 0, 0.05), (1.0, 200, 0.999)],
)
def test_process_logits_matches_the_sort_based_filter(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 200, generator=g) * 3
    T, tk, tp, _ = sampling(3, temperature, top_k, top_p)
    got = plugins.process_logits(logits, T, tk, tp)
    torch.testing.assert_close(got, sorted_filter_probs(logits, T, tk, tp), atol=1e-6, rtol=1e-5)


def test_process_logits_rows_have_their_own_parameters_and_greedy_rows_are_one_hot():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]])).expand(3, 1, 4).contiguous()
    p = plugins.process_logits(
        logits, torch.tensor([1.0, 1.0, 0.0]), torch.tensor([2, 0, 0]), torch.tensor([1.0, 0.6, 1.0])
    )
    torch.testing.assert_close(p[0, 0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(p[1, 0], torch.tensor([0.625, 0.375, 0.0, 0.0]))  # 0.5 < 0.6: 0.3 crosses it
    assert p[2, 0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top_p_keeps_every_token_tied_at_the_cut():
    logits = torch.log(torch.tensor([[[0.4, 0.2, 0.2, 0.2]]]))
    p = plugins.process_logits(logits, torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.5]))
    assert (p[0, 0] > 0).all()


def test_top_p_on_a_flat_vocabulary_of_one_value():
    logits = torch.zeros(1, 1, 1000)
    p = plugins.process_logits(logits, torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.3]))
    torch.testing.assert_close(p, torch.full((1, 1, 1000), 1e-3))


# ---- greedy_accept ---------------------------------------------------------------------------------------------
def test_greedy_accepts_the_longest_matching_prefix_per_row():
    drafts = torch.tensor([[5, 6, 7], [5, 9, 7], [1, 2, 3], [5, 6, 7]])
    logits = logits_with_argmax([[5, 6, 7, 8], [5, 6, 7, 8], [4, 2, 3, 8], [5, 6, 7, 8]], 10)
    num, nxt = plugins.greedy_accept(drafts, torch.tensor([3, 3, 3, 2]), logits)
    assert num.tolist() == [3, 1, 0, 2]  # all, one, nothing, capped by the row's draft count
    assert nxt.tolist() == [8, 6, 4, 7]


def test_greedy_with_no_drafts_and_a_vocabulary_of_one():
    num, nxt = plugins.greedy_accept(
        torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.randn(2, 1, 7)
    )
    assert num.tolist() == [0, 0]
    num, nxt = plugins.greedy_accept(torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 1]), torch.randn(2, 4, 1))
    assert num.tolist() == [3, 1] and nxt.tolist() == [0, 0]


def test_padding_past_a_rows_draft_count_is_never_read_nor_checked():
    logits = logits_with_argmax([[3, 4, 0]], 5)
    num, nxt = plugins.greedy_accept(torch.tensor([[3, 99]]), torch.tensor([1]), logits)  # 99 is padding
    assert num.tolist() == [1] and nxt.tolist() == [4]


def test_greedy_ties_go_to_the_lowest_token_id_like_argmax():
    logits = torch.zeros(1, 2, 5)
    logits[0, :, 2] = logits[0, :, 4] = 1.0
    num, nxt = plugins.greedy_accept(torch.tensor([[4]]), torch.tensor([1]), logits)
    assert num.tolist() == [0] and nxt.tolist() == [2]


def test_greedy_host_path_equals_the_torch_path():
    """CPU float logits take the NumPy walk (accept.py, _greedy_accept_host); other devices and bf16 the torch ops.
    Both must give the same counts and tokens, ties and rows without drafts included."""
    from plugins.reference.accept import _greedy_accept_host, _greedy_accept_torch

    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        B, k, V = 1 + trial % 5, trial % 6, 3 + trial % 4  # a small vocabulary makes ties and matches common
        logits = torch.randint(0, 3, (B, k + 1, V), generator=gen).float()
        argmax = logits.argmax(-1)
        drafts = torch.where(
            torch.rand(B, k, generator=gen) < 0.7, argmax[:, :k], torch.randint(0, V, (B, k), generator=gen)
        )
        num = torch.randint(0, k + 1, (B,), generator=gen)
        host, device = _greedy_accept_host(drafts, num, logits), _greedy_accept_torch(drafts, num, logits)
        assert [x.tolist() for x in host] == [x.tolist() for x in device], trial
    assert not on_host(torch.zeros(1, dtype=torch.bfloat16)) and on_host(torch.zeros(1))


def test_host_uniforms_are_the_tensor_paths_bits(monkeypatch):
    """Small draws on CPU hash in Python integers (rng.HOST_DRAWS); they must be the tensor path's numbers exactly
    (the Triton kernels draw those too), for any int64 seed, negative ones included."""
    from plugins.reference import rng

    gen = torch.Generator().manual_seed(0)
    for B, n in ((1, 1), (3, 5), (8, 16), (2, 0)):
        seeds = torch.randint(-(2**63), 2**63 - 1, (B,), dtype=torch.int64, generator=gen)
        counters = torch.randint(0, 1 << 20, (B, n), generator=gen)
        host = rng.uniforms(seeds, counters)
        with monkeypatch.context() as m:
            m.setattr(rng, "HOST_DRAWS", -1)  # every draw on the tensor path
            tensor = rng.uniforms(seeds, counters)
        assert host.dtype == tensor.dtype == torch.float32 and torch.equal(host, tensor), (B, n)


# ---- rejection_sample ------------------------------------------------------------------------------------------
def test_rejection_sample_on_greedy_rows_is_greedy_accept():
    logits, drafts = argmax_drafts_missing_at(6, 3, 9, misses=[(1, 1), (2, 0)])
    num = torch.tensor([3, 3, 3, 1, 0, 2])
    T, tk, tp, seeds = sampling(6, temperature=0.0)
    got = plugins.rejection_sample(drafts, num, logits, None, T, tk, tp, seeds)
    want = plugins.greedy_accept(drafts, num, logits)
    assert [x.tolist() for x in got] == [x.tolist() for x in want]


def test_rejection_sample_is_reproducible_per_row_seed_whatever_the_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5, 30, generator=g)
    drafts = torch.randint(30, (8, 4), generator=g)
    num = torch.tensor([4, 3, 2, 1, 0, 4, 4, 4])
    T, tk, tp, seeds = sampling(8, top_k=10, top_p=0.9)
    a = plugins.rejection_sample(drafts, num, logits, None, T, tk, tp, seeds)
    b = plugins.rejection_sample(drafts[2:5], num[2:5], logits[2:5], None, T[2:5], tk[2:5], tp[2:5], seeds[2:5])
    assert a[0][2:5].tolist() == b[0].tolist() and a[1][2:5].tolist() == b[1].tolist()
    c = plugins.rejection_sample(drafts, num, logits, None, T, tk, tp, seeds + 1)
    assert a[1].tolist() != c[1].tolist()


def test_rejection_sample_without_drafts_draws_what_a_row_with_no_drafts_in_a_block_draws():
    """k = 0 (target-only sampling) takes a short path: the same draw (counter 1 at slot 0) as the general path
    gives a row of a k-wide block that has no drafts, greedy rows, top-k and top-p included."""
    g = torch.Generator().manual_seed(1)
    B, V = 6, 97
    logits = torch.randn(B, 2, V, generator=g) * 3
    T = torch.tensor([1.0, 0.0, 0.7, 1.5, 1.0, 0.0])
    tk = torch.tensor([0, 0, 5, 0, 40, 3])
    tp = torch.tensor([1.0, 1.0, 1.0, 0.8, 0.5, 1.0])
    seeds = torch.randint(0, 2**62, (B,), generator=g)
    none = torch.zeros(B, dtype=torch.long)
    short = reference.rejection_sample(torch.zeros(B, 0, dtype=torch.long), none, logits[:, :1], None, T, tk, tp, seeds)
    general = reference.rejection_sample(torch.zeros(B, 1, dtype=torch.long), none, logits, None, T, tk, tp, seeds)
    assert short[0].tolist() == general[0].tolist() == [0] * B
    assert short[1].tolist() == general[1].tolist()
    assert short[1][1] == logits[1, 0].argmax() and short[1][5] == logits[5, 0].argmax()


def test_a_target_certain_of_the_draft_accepts_it():
    logits = torch.log(torch.tensor([[[1e-9, 1.0, 1e-9], [1e-9, 1e-9, 1.0]]]))
    q = torch.tensor([[[0.5, 0.5, 0.0]]])
    num, nxt = plugins.rejection_sample(torch.tensor([[1]]), torch.tensor([1]), logits, q, *sampling(1))
    assert num.tolist() == [1] and nxt.tolist() == [2]


def test_the_recovered_token_never_is_the_rejected_draft():
    # the target never emits token 0 (top-k 2 cuts it): a draft of 0 is always rejected, the recovered token is 1 or 2
    logits = torch.log(torch.tensor([[[0.1, 0.3, 0.6], [1 / 3, 1 / 3, 1 / 3]]])).expand(50, 2, 3).contiguous()
    T, tk, tp, seeds = sampling(50, top_k=2)
    num, nxt = plugins.rejection_sample(
        torch.zeros(50, 1, dtype=torch.long), torch.ones(50, dtype=torch.long), logits, None, T, tk, tp, seeds
    )
    assert num.tolist() == [0] * 50 and set(nxt.tolist()) == {1, 2}


@pytest.mark.parametrize("with_q", [True, False], ids=["q", "one-hot-q"])
@pytest.mark.parametrize("filters", [dict(), dict(top_k=4, top_p=0.8, temperature=0.8)], ids=["plain", "filtered"])
def test_rejection_sample_commits_the_target_distribution(with_q, filters):
    p0, p1 = step_p_values(reference.rejection_sample, with_q=with_q, **filters)
    assert p0 > 1e-3 and p1 > 1e-3


def _walk(*args):
    """rejection_walk with the batched op's outputs (tensors), for the checks written against the op."""
    from plugins.reference.accept import rejection_walk

    return tuple(torch.tensor(x, dtype=torch.long) for x in rejection_walk(*args))


@pytest.mark.parametrize("with_q", [True, False], ids=["q", "one-hot-q"])
@pytest.mark.parametrize("filters", [dict(), dict(top_k=4, top_p=0.8, temperature=0.8)], ids=["plain", "filtered"])
def test_the_host_walk_commits_the_target_distribution(with_q, filters):
    p0, p1 = step_p_values(_walk, with_q=with_q, **filters)
    assert p0 > 1e-3 and p1 > 1e-3


def test_the_host_walk_draws_what_the_batched_path_draws():
    """Host logits of sampled rows take the row-by-row walk (accept.py, rejection_walk; deepspec's verify uses it
    on CPU): its counts and tokens must be the batched op's, bit for bit, in batches that mix greedy and sampled
    rows, temperatures, top-k and top-p, one-hot and drawn drafts, rows without drafts and rows that accept all."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        B, k, V = 1 + trial % 5, trial % 5, 97
        logits = torch.randn(B, k + 1, V, generator=gen) * 2
        num = torch.randint(0, k + 1, (B,), generator=gen)
        T = torch.where(torch.rand(B, generator=gen) < 0.2, 0.0, torch.rand(B, generator=gen) * 1.5 + 0.1)
        tk = torch.where(torch.rand(B, generator=gen) < 0.3, torch.randint(1, 20, (B,), generator=gen), 0)
        tp = torch.where(torch.rand(B, generator=gen) < 0.3, torch.rand(B, generator=gen) * 0.9 + 0.1, 1.0)
        seeds = torch.randint(-(2**62), 2**62, (B,), generator=gen)
        if trial % 2:  # drafts drawn from a q of their own
            q = torch.softmax(torch.randn(B, k, V, generator=gen) * 2, -1)
            drafts = torch.multinomial(q.view(-1, V), 1, generator=gen).view(B, k) if k else torch.zeros(B, 0).long()
        else:  # deterministic drafts, mostly the target's own argmax so that rows accept some
            q = None
            drafts = torch.where(
                torch.rand(B, k, generator=gen) < 0.7,
                logits[:, :k].argmax(-1),
                torch.randint(0, V, (B, k), generator=gen),
            )
        want = reference.rejection_sample(drafts, num, logits, q, T, tk, tp.float(), seeds)
        got = _walk(drafts, num, logits, q, T, tk, tp.float(), seeds)
        assert [x.tolist() for x in got] == [x.tolist() for x in want], trial


def test_the_distribution_check_rejects_a_verifier_that_accepts_everything():
    p0, _ = step_p_values(accept_everything, with_q=True)
    assert p0 < 1e-3


# ---- confidence_truncate ---------------------------------------------------------------------------------------
def test_confidence_truncate_cuts_before_the_first_weak_slot():
    conf = torch.tensor([[0.9, 0.9, 0.5, 0.9], [0.4, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    num, survival = plugins.confidence_truncate(conf, torch.tensor([4, 4, 2]), 0.5)
    assert num.tolist() == [2, 0, 2]
    torch.testing.assert_close(survival[0], torch.tensor([0.9, 0.81, 0.0, 0.0]))
    assert survival[1].tolist() == [0.0] * 4


# ---- bad inputs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case,message",
    [
        ("counts", r"num_draft_tokens must be in \[0, 2\]"),
        ("shape", "k\\+1 = 3 positions"),
        ("dtype", "draft_tokens must be torch.int64"),
        ("token", r"token ids in \[0, 5\)"),
        ("q", "draft_probs must be \\[B, k, V\\]"),
        ("top_p", r"top_p must be in \(0, 1\]"),
        ("batch", "batch sizes"),
    ],
)
def test_bad_inputs_fail_with_a_message_naming_the_input(case, message):
    drafts, num, logits = torch.zeros(2, 2, dtype=torch.long), torch.tensor([2, 1]), torch.randn(2, 3, 5)
    q = None
    T, tk, tp, seeds = sampling(2)
    if case == "counts":
        num = torch.tensor([3, 1])
    elif case == "shape":
        logits = torch.randn(2, 2, 5)
    elif case == "dtype":
        drafts = drafts.int()
    elif case == "token":
        drafts = torch.tensor([[0, 5], [1, 1]])
    elif case == "q":
        q = torch.rand(2, 3, 5)
    elif case == "top_p":
        tp = torch.tensor([1.0, 0.0])
    elif case == "batch":
        seeds = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        plugins.rejection_sample(drafts, num, logits, q, T, tk, tp, seeds)


def test_ops_trace_through_torch_export():
    class Verify(torch.nn.Module):
        def forward(self, drafts, num, logits, T, tk, tp, seeds):
            return plugins.rejection_sample(drafts, num, logits, None, T, tk, tp, seeds)

    args = (torch.zeros(2, 2, dtype=torch.long), torch.tensor([2, 1]), torch.randn(2, 3, 5), *sampling(2))
    program = torch.export.export(Verify(), args)
    assert "deepspec.rejection_sample" in str(program.graph)
    assert [x.tolist() for x in program.module()(*args)] == [x.tolist() for x in Verify()(*args)]
