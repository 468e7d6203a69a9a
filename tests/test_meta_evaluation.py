"""Meta-evaluation measures (evaluation/meta_evaluation.py): hand-worked cases, scipy as the judge of tau-b."""
from __future__ import annotations

import numpy as np
import pytest

from evaluation.meta_evaluation import (
    bootstrap_rank_intervals,
    kendall_tau_b,
    kendalls_w,
    method_ranks,
    metric_agreement,
)


def test_kendalls_w_by_hand():
    ranking = [1, 2, 3, 4]
    assert kendalls_w(np.array([ranking, ranking, ranking])) == pytest.approx(1.0)
    assert kendalls_w(np.array([ranking, ranking[::-1]])) == pytest.approx(0.0)
    # m = 2, n = 3: rank sums (2, 5, 5), mean 4, S = 4 + 1 + 1 = 6; W = 12 * 6 / (4 * 24) = 0.75
    assert kendalls_w(np.array([[1, 2, 3], [1, 3, 2]])) == pytest.approx(0.75)
    # ties: rows (1, 2.5, 2.5) and (1, 2, 3): rank sums (2, 4.5, 5.5), S = 4 + 0.25 + 2.25 = 6.5;
    # T = 2^3 - 2 = 6; W = 12 * 6.5 / (4 * 24 - 2 * 6) = 78 / 84
    assert kendalls_w(np.array([[10, 20, 20], [5, 6, 7]])) == pytest.approx(78 / 84)
    with pytest.raises(ValueError, match="raters"):
        kendalls_w(np.array([ranking]))


def test_ranks_read_the_direction():
    assert method_ranks([0.9, 0.1, 0.5], True).tolist() == [1, 3, 2]
    assert method_ranks([0.9, 0.1, 0.5], False).tolist() == [3, 1, 2]
    assert method_ranks([0.2, 0.2, 0.1], True).tolist() == [1.5, 1.5, 3]
    with pytest.raises(ValueError, match="direction"):
        method_ranks([1.0, 2.0], None)


def test_tau_b_matches_scipy_and_agreement_flags_contradictions():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(5):
        x, y = rng.integers(0, 4, 9).astype(float), rng.integers(0, 4, 9).astype(float)   # with ties
        assert kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
    scores = {"auc_pos": [10.0, 20.0, 30.0], "auc_neg": [30.0, 20.0, 10.0], "gini": [0.1, 0.3, 0.2]}
    directions = {"auc_pos": False, "auc_neg": True, "gini": True}
    names, table, contradictory = metric_agreement(scores, directions)
    assert names == list(scores)
    assert table[0, 1] == pytest.approx(1.0)          # opposite directions, the same ranking of the methods
    assert table[0, 2] == pytest.approx(-1 / 3) and ("auc_pos", "gini") in contradictory
    assert ("auc_pos", "auc_neg") not in contradictory


def test_bootstrap_intervals_are_seeded_and_certain_for_a_dominating_method():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(40, 1))
    scores = np.hstack([base + 5, base + rng.normal(0, 1, (40, 1)), base + rng.normal(0, 1, (40, 1))])
    scores[3, 1] = np.nan                              # left out
    a = bootstrap_rank_intervals(scores, True, resamples=200, seed=4)
    b = bootstrap_rank_intervals(scores, True, resamples=200, seed=4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert a["low"][0] == a["high"][0] == a["mean_rank"][0] == 1.0
    assert a["low"][1] == 2 and a["high"][1] == 3      # the two noisy methods trade places
    flipped = bootstrap_rank_intervals(scores, False, resamples=200, seed=4)
    assert flipped["mean_rank"][0] == 3.0


def test_wilcoxon_and_holm_match_scipy_and_by_hand():
    stats = pytest.importorskip("scipy.stats")
    from evaluation.meta_evaluation import holm, random_separation, wilcoxon_p

    rng = np.random.default_rng(2)
    for shift in (0.0, 0.3, 1.0):
        x = rng.normal(size=30).round(1)                                    # ties in |d|
        y = (x + rng.normal(shift, 1, size=30)).round(1)
        y[:3] = x[:3]                                                       # zero differences
        theirs = stats.wilcoxon(x, y, zero_method="wilcox", correction=False, method="approx").pvalue
        assert wilcoxon_p(x, y) == pytest.approx(theirs, rel=1e-10)
    # Holm by hand: p = (0.01, 0.04, 0.03) -> sorted 0.01 * 3, 0.03 * 2, max(0.06, 0.04 * 1)
    assert holm([0.01, 0.04, 0.03]).tolist() == pytest.approx([0.03, 0.06, 0.06])
    assert np.isnan(holm([np.nan, 0.2])[0]) and holm([np.nan, 0.2])[1] == pytest.approx(0.2)
    scores = {"random": rng.normal(size=40), "good": rng.normal(2, 1, size=40)}
    scores["same"] = scores["random"] + rng.normal(0, 1e-3, size=40)
    result = random_separation(scores)
    assert result["good"]["differs"] == 1.0 and result["same"]["differs"] == 0.0
    with pytest.raises(KeyError, match="random map"):
        random_separation({"good": [1.0]})


def test_krippendorff_and_cronbach_by_hand():
    from evaluation.meta_evaluation import cronbach_alpha, krippendorff_alpha_interval

    ranks = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    assert krippendorff_alpha_interval(ranks) == pytest.approx(1.0)
    # coders x units [[1, 2], [1, 3]]: D_o = (0 + 2 * (2 - 3)^2) / 1 / 4 = 0.5; the 4 values 1, 1, 2, 3 give
    # ordered-pair squared differences 22 over 4 * 3 pairs: D_e = 22 / 12; alpha = 1 - 0.5 / (22 / 12) = 8 / 11
    assert krippendorff_alpha_interval(np.array([[1, 2], [1, 3]])) == pytest.approx(8 / 11)
    assert np.isnan(krippendorff_alpha_interval(np.ones((2, 3))))
    # columns (1, 2, 3) and (1, 3, 2): variances 1 and 1, sums (2, 5, 5) variance 3: alpha = 2 (1 - 2 / 3)
    assert cronbach_alpha(np.array([[1, 1], [2, 3], [3, 2]])) == pytest.approx(2 / 3)
    assert cronbach_alpha(np.array([[1, 1], [2, 2], [3, 3]])) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="variants"):
        cronbach_alpha(np.array([[1.0], [2.0]]))


def test_metaquantus_scores_re_derived_on_a_toy():
    """Three methods x 6 samples of a higher-is-better metric: a resilience perturbation that leaves the ranking
    and nearly the scores, an adversary that lowers every score. Worked by hand; the direction read from the
    metric's declaration (upstream's truthiness of a string ``lower_is_better`` would invert IEC_AR)."""
    stats = pytest.importorskip("scipy.stats")
    from evaluation.meta_evaluation import iac, iec_adversary, iec_resilience, meta_consistency, wilcoxon_p

    q = np.array([[0.9, 0.8, 0.85, 0.95, 0.7, 0.75],     # method 0 best on every sample
                  [0.5, 0.4, 0.45, 0.55, 0.3, 0.35],
                  [0.1, 0.2, 0.15, 0.05, 0.25, 0.0]])
    resilient = q + np.array([0.01, -0.01, 0.0, 0.01, -0.01, 0.0])      # same ranking, symmetric noise, zeros
    adversary = q - 0.3
    assert iec_resilience(q, resilient) == 1.0
    assert iec_adversary(q, adversary, True) == 1.0                     # every score fell: the metric reacts
    assert iec_adversary(q, adversary, False) == 0.0                    # the inverted reading
    swapped = q[[1, 0, 2]]                                              # methods 0 and 1 trade places everywhere
    assert iec_resilience(q, swapped) == pytest.approx(1 / 3)           # only the worst method keeps its position
    with pytest.raises(TypeError, match="PR #10"):
        iec_adversary(q, adversary, "False")
    # IAC: zsplit Wilcoxon judged against scipy; the adversary's p is tiny, 1 - p near 1
    for row in range(3):
        theirs = stats.wilcoxon(q[row], resilient[row], zero_method="zsplit", method="approx").pvalue
        assert wilcoxon_p(q[row], resilient[row], zero_split=True) == pytest.approx(theirs, rel=1e-10)
    assert iac(q[0], resilient[0], "resilience") > 0.5
    assert iac(q[0], adversary[0], "adversary") > 0.95
    assert iac(q[0], q[0], "resilience") == 1.0
    assert meta_consistency(1.0, 1.0, 1.0, 0.0) == 0.75


def _upstream_iec_adversary(q_star, q_hat, lower_is_better):
    """MetaQuantus' IEC of an adversary test (``compute_iec_adversary``), re-derived as the paper's eq. 9 and the
    upstream loop read it, not imported: per (method, sample) 1 when the perturbed score is worse, "worse" decided
    by the truthiness of ``lower_is_better`` (higher when truthy, lower otherwise)."""
    hits = []
    for row_star, row_hat in zip(q_star, q_hat):
        for before, after in zip(row_star, row_hat):
            hits.append(float(before < after) if lower_is_better else float(before > after))
    return float(np.mean(hits))


def _upstream_iec_resilience(q_star, q_hat):
    """MetaQuantus' IEC of a resilience test (eq. 8), re-derived: per sample, the methods sorted by score before
    and after; 1 per rank position held by the same method."""
    hits = []
    for before, after in zip(np.argsort(q_star, axis=0).T, np.argsort(q_hat, axis=0).T):
        hits += [float(a == b) for a, b in zip(before, after)]
    return float(np.mean(hits))


def test_metaquantus_direction_bug_shown_and_avoided():
    """Upstream passes each metric's configured ``score_direction`` ("higher" / "lower") where its IEC expects the
    bool ``lower_is_better`` (MetaQuantus PR #10): a non-empty string is truthy, so every metric is read as
    lower-is-better. On a higher-is-better toy whose adversary lowers every score (a metric that reacts fully), the
    upstream reading gives IEC_AR 0 and MC a quarter too low; ours, reading the declared bool, gives 1, and equals
    upstream's formula fed the correct bool. A lower-is-better metric is read right either way."""
    from evaluation.meta_evaluation import iec_adversary, iec_resilience, meta_consistency

    rng = np.random.default_rng(3)
    q = rng.uniform(0.2, 1.0, size=(4, 10))                         # 4 methods x 10 samples, higher is better
    adversary = q - rng.uniform(0.05, 0.2, size=q.shape)             # every score falls
    assert _upstream_iec_adversary(q, adversary, "higher") == 0.0    # the bug: "higher" is truthy
    assert iec_adversary(q, adversary, True) == 1.0
    assert iec_adversary(q, adversary, True) == _upstream_iec_adversary(q, adversary, False)
    # a lower-is-better metric (scores negated: the adversary raises them) is read right by both
    assert _upstream_iec_adversary(-q, -adversary, "lower") == iec_adversary(-q, -adversary, False) == 1.0
    # a partial reaction: half the scores fall, half rise; the two readings are complements
    mixed = q + np.where(rng.random(q.shape) < 0.5, -0.1, 0.1)
    ours = iec_adversary(q, mixed, True)
    assert ours == pytest.approx(1.0 - _upstream_iec_adversary(q, mixed, "higher"))
    assert ours == pytest.approx(float((mixed < q).mean()))
    # MC with the other three scores perfect: upstream's reading loses exactly a quarter
    assert meta_consistency(1.0, 1.0, 1.0, ours) - meta_consistency(
        1.0, 1.0, 1.0, _upstream_iec_adversary(q, mixed, "higher")) == pytest.approx((2 * ours - 1) / 4)
    # IEC_NR equals the re-derived upstream loop on scores without ties (with ties upstream's default quicksort
    # orders tied methods as it happens to; ours keeps them in method order, a stable sort)
    for _ in range(5):
        a, b = rng.normal(size=(4, 7)), rng.normal(size=(4, 7))
        assert iec_resilience(a, b) == pytest.approx(_upstream_iec_resilience(a, b))
    assert iec_resilience(np.zeros((3, 2)), np.zeros((3, 2))) == 1.0   # all tied: nothing moved
