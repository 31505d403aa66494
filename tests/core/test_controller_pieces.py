"""The controller's pure pieces against small cases worked out by hand (aah_method §2.4-§2.8)."""

import math

import pytest
import torch

from aah_core.controller.clustering import churn, forced_split, leader_cluster, merge_small_groups
from aah_core.controller.features import head_features, head_stats, pooled_group_features
from aah_core.controller.hierarchy import Level, balanced_split, build_upper_levels, link, passthrough
from aah_core.controller.policy import clamp_top_down, ramp, resolution_ema, select, warmup_index, windows_of
from aah_core.controller.scorers import LayerScorers, enriched_inputs, sibling_pairs

T = torch.tensor


def test_leader_clustering_on_a_four_head_toy():
    # h0, h1 point along x, h2, h3 along y: cos(h0, h1) = 0.994, cos(centroid01, h2) = 0.055 < 0.72
    feats = T([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    assert leader_cluster(feats, 0.72) == [[0, 1], [2, 3]]
    # a threshold above every similarity leaves each head alone; below all of them merges everything
    assert leader_cluster(feats, 0.999) == [[0], [1], [2], [3]]
    assert leader_cluster(feats, -1.0) == [[0, 1, 2, 3]]


def test_forced_split_picks_the_least_similar_pair_and_breaks_ties_to_the_smaller_side():
    # every cosine is > 0.99, so one group forms and the forced bipartition fires (§2.4)
    feats = T([[1.0, 1.0], [1.0, 0.9], [0.9, 1.0], [1.0, 1.05]])
    assert leader_cluster(feats, 0.72) == [[0, 1, 2, 3]]
    # least similar pair: (1, 2), cos = 1.8 / 1.81 = 0.9945. Head 0 is equidistant (exact tie) -> the
    # smaller side (sizes 1 and 1: the first); head 3 is closer to head 2 (0.9996 vs 0.9970)
    assert leader_cluster(feats, 0.72, forced_bipartition=True) == [[0, 1], [2, 3]]
    # churn: (1, 2) shared a group last time -> +0.02 lifts it to 1.0; the next least similar pair is
    # (1, 3) at 0.9970; heads 0 and 2 are both closer to head 3
    split = forced_split(feats, prev_groups=[[1, 2], [0, 3]], churn_penalty=0.02)
    assert split == [[1], [0, 2, 3]]


def test_small_groups_merge_only_when_more_than_two_groups_remain():
    feats = T([[1.0, 0.0], [0.0, 1.0], [0.05, 1.0], [0.0, 1.0], [1.0, 0.05]])
    groups = leader_cluster(feats, 0.95)
    assert groups == [[0, 4], [1, 2, 3]]  # two groups: nothing merges even though [0, 4] is small
    assert merge_small_groups(feats, [[0], [4], [1, 2, 3]], 0.95, 3) == [[0, 4], [1, 2, 3]]
    assert merge_small_groups(feats, [[0], [1, 2, 3]], 0.95, 3) == [[0], [1, 2, 3]]


def test_cosine_normdiff_separates_parallel_vectors_of_different_norm():
    feats = T([[1.0, 1.0], [2.0, 2.0], [1.02, 1.0]])
    assert leader_cluster(feats, 0.76, metric="cosine") == [[0, 1, 2]]
    # |norm gap| / max norm = 0.5 for rows 0 and 1: sim = 1 - 16 * 0.5 < 0.76
    assert leader_cluster(feats, 0.76, metric="cosine_normdiff") == [[0, 2], [1]]


def test_parent_clamp_takes_the_min_top_down():
    # level 2: one group; level 1: two groups; level 0: three groups with parents [0, 0, 1]
    levels = link([Level([[0], [1], [2]], torch.zeros(3, 1)), Level([[0, 1], [2]], torch.zeros(2, 1)),
                   Level([[0, 1]], torch.zeros(1, 1))])
    assert levels[0].parent == [0, 0, 1] and levels[1].parent == [0, 0] and levels[2].parent is None
    raw = [[2, 0, 3], [3, 0], [1]]
    # level 1: [min(3, 1), min(0, 1)] = [1, 0]; level 0: [min(2, 1), min(0, 1), min(3, 0)] = [1, 0, 0]
    assert clamp_top_down(raw, levels) == [[1, 0, 0], [1, 0], [1]]
    assert clamp_top_down(raw, levels, parent_constraint=False) == raw


def test_joint_pairs_siblings_in_ascending_order():
    assert sibling_pairs(None, 5) == [(0, 1), (2, 3)]  # top level: all groups, odd leftover unpaired
    assert sibling_pairs([1, 0, 1, 0, 1], 5) == [(1, 3), (0, 2)]  # parent 0: [1, 3]; parent 1: [0, 2], 4 left
    assert sibling_pairs([0, 1, 2], 3) == []  # identity levels: one child per parent, no pairs


def test_joint_scorer_replaces_the_logits_of_paired_groups_only():
    scorers = LayerScorers(in_dim=5, n_buckets=3, control_dim=4, joint_hidden=6, deep=False, seed=7)
    u = torch.randn(3, 5)
    z, n_pairs = scorers.logits(u, None)
    independent = scorers.scorer(u)
    joint = scorers.joint(u[[0]], u[[1]])
    assert n_pairs == 1
    torch.testing.assert_close(z[0], joint[0, 0]) and torch.testing.assert_close(z[1], joint[0, 1])
    torch.testing.assert_close(z[2], independent[2])  # the odd group keeps its own logits
    again = LayerScorers(in_dim=5, n_buckets=3, control_dim=4, joint_hidden=6, deep=False, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(scorers.state_dict().values(), again.state_dict().values()))
    assert not any(p.requires_grad for p in scorers.parameters())  # never trained, as in the paper


def test_enriched_inputs_have_29_columns_with_level_parent_sibling_and_size_terms():
    f0 = T([[1.0] * 9, [3.0] * 9])
    levels = passthrough(Level([[0, 2], [1]], f0), 2)
    u0, u1 = enriched_inputs(levels)
    assert u0.shape == (2, 29) and u1.shape == (2, 29)
    assert u0[0, 9] == 0.0 and u1[0, 9] == 1.0  # level / (L - 1)
    assert torch.all(u0[:, 10:19] == 0)  # identity parent: F_l - F_{l+1}[parent] = 0
    assert torch.all(u0[0, 19:28] == -1.0) and torch.all(u0[1, 19:28] == 1.0)  # minus the sibling mean (2)
    assert u0[:, 28].tolist() == [2 / 3, 1 / 3]  # group sizes in heads


def test_select_scatters_group_choices_to_heads():
    levels = passthrough(Level([[0, 3], [1, 2]], torch.rand(2, 9)), 1)
    scorers = LayerScorers(29, 4, 16, None, False, seed=0)
    sel = select(levels, enriched_inputs(levels), scorers, n_head=4)
    assert sel.head_idx[0] == sel.head_idx[3] == sel.level_idx[0][0]
    assert sel.head_idx[1] == sel.head_idx[2] == sel.level_idx[0][1]


def test_upper_levels_stop_on_one_group_and_keep_identity_copies_unless_fixed():
    apart = Level([[0], [1]], T([[1.0, 0.0], [0.0, 1.0]]))
    assert len(build_upper_levels(apart, 4, 0.76, "cosine", 16.0)) == 4  # never merges: identity copies
    assert len(build_upper_levels(apart, 4, 0.76, "cosine", 16.0, stop_on_identity=True)) == 1
    close = Level([[0], [1]], T([[1.0, 0.0], [1.0, 0.01]]))
    assert len(build_upper_levels(close, 4, 0.76, "cosine", 16.0)) == 1  # merges into one: not appended


def test_post_processing_warmup_resolution_ema_and_ramp():
    assert warmup_index([4, 16, 64], 64, fixed=False) == 2
    assert warmup_index([4, 16, 32], 64, fixed=False) == 0  # the paper's fallback to the smallest window
    assert warmup_index([4, 16, 32], 64, fixed=True) is None
    assert windows_of([None, 0, 2], [4, 16, 32], 64) == [64, 4, 32]
    assert windows_of([0, 1], [4, 16], 64, w_min=8) == [8, 16]
    state, idx = resolution_ema(None, [0, 3], 0.15, 4)
    assert state == [0.0, 3.0] and idx == [0, 3]
    state, idx = resolution_ema(state, [3, 0], 0.15, 4)  # 0.15 * 0 + 0.85 * 3 = 2.55 -> 3; 0.45 -> 0
    assert state == pytest.approx([2.55, 0.45]) and idx == [3, 0]
    assert ramp([0, 0], step=10, warmup=10, ramp_steps=4, full_idx=3) == [2, 2]  # p = 1/4: round(2.25)
    assert ramp([0, 1], step=13, warmup=10, ramp_steps=4, full_idx=3) == [0, 1]


def test_churn_and_balanced_split():
    assert churn([[0, 1], [2, 3]], [[0, 1], [2, 3]], 4) == (0.0, 1.0)
    reassign, overlap = churn([[0, 1], [2, 3]], [[0, 1, 2], [3]], 4)
    assert reassign == 0.25 and overlap == 0.25  # shared pairs {01} over the union {01, 23, 02, 12}
    assert balanced_split(6, None) == [[0, 2, 4], [1, 3, 5]]
    a, b = balanced_split(6, 0)
    assert sorted(a + b) == list(range(6)) and len(a) == len(b) == 3 and balanced_split(6, 0) == [a, b]


def test_head_stats_match_the_definitions_on_a_small_batch():
    torch.manual_seed(0)
    q, k, v, y = (torch.randn(2, 2, 8, 4, dtype=torch.float64) for _ in range(4))
    stats = head_stats(q, k, v, y, torch.tensor([8, 3]), n_rows=8, n_seqs=2)
    feats = head_features(stats, stats, fixed_usage=False)
    torch.testing.assert_close(feats[:, 0], q.abs().mean(dim=(0, 2, 3)), check_dtype=False)
    torch.testing.assert_close(feats[:, 1], q.std(dim=(0, 2, 3)), check_dtype=False)  # Bessel-corrected
    torch.testing.assert_close(feats[:, 7], y.norm(dim=-1).mean(dim=(0, 2)), check_dtype=False)
    # full attention probabilities for the reference values
    scores = (q @ k.transpose(-2, -1)) / 2.0
    i, j = torch.arange(8).view(8, 1), torch.arange(8).view(1, 8)
    w = torch.tensor([8, 3]).view(2, 1, 1)
    p = scores.masked_fill(~((j <= i) & (j > i - w)), float("-inf")).softmax(-1)
    entropy = -(p * (p + 1e-9).log()).sum(-1).mean(dim=(0, 2)) / math.log(8)
    torch.testing.assert_close(feats[:, 6], entropy, check_dtype=False)
    torch.testing.assert_close(feats[:, 8], p[..., 7].mean(dim=(0, 2)), check_dtype=False)  # usage = key T-1
    fixed = head_features(stats, stats, fixed_usage=True)
    torch.testing.assert_close(fixed[:, 8], (p * (i - j).clamp(min=0)).sum(-1).mean(dim=(0, 2)) / 8, check_dtype=False)
    # pooled group features: the std pools all elements of the member heads
    pooled = pooled_group_features([[0, 1]], stats, stats, fixed_usage=False)
    torch.testing.assert_close(pooled[0, 1], q.std(), check_dtype=False)
