"""Meta-evaluation of metrics from method scores (a first part of the meta-evaluation; no run loading, no dashboard).

* :func:`method_ranks`: the rank of every method under one metric (1 = best), read in the metric's declared
  direction (``higher_is_better``; a metric without a direction is refused), ties sharing their mean rank;
* :func:`kendalls_w`: Kendall's coefficient of concordance of ``m`` rankings of ``n`` methods (e.g. one per seed),
  with the tie correction (Kendall & Babington Smith 1939; Legendre 2005, J. Agric. Biol. Environ. Stat. 10(2),
  eq. 1-2): ``W = 12 S / (m^2 (n^3 - n) - m T)``, ``S`` the sum of squared deviations of the methods' rank sums
  from their mean, ``T = sum (t^3 - t)`` over the groups of tied ranks; 1: identical rankings, 0: no agreement
  (a ranking and its reverse);
* :func:`kendall_tau_b` and :func:`metric_agreement`: Kendall's tau-b (Kendall 1945, Biometrika 33(3)) between every
  pair of metrics' method scores, each metric turned to higher-is-better first; a pair with tau < 0 ranks the
  methods in contradictory orders and is flagged;
* :func:`bootstrap_rank_intervals`: each method's rank under one metric over ``resamples`` bootstrap resamples of
  the samples (rows of the per-sample scores, drawn from ``seed``; rows with a NaN left out): its mean rank and the
  percentile interval;
* :func:`krippendorff_alpha_interval`: Krippendorff's alpha with the interval metric (Krippendorff 2011,
  "Computing Krippendorff's alpha-reliability", sec. C and F), ``1 - D_o / D_e``, of values ``[coders, units]``
  without missing values: e.g. the samples as coders of the methods' per-sample ranks (1: every sample ranks the
  methods alike);
* :func:`cronbach_alpha`: ``k / (k - 1) (1 - sum var(item) / var(sum of items))`` (Cronbach 1951, Psychometrika
  16(3), eq. 2; sample variances) of scores ``[observations, k variants]``, e.g. a metric under several fill values;
* MetaQuantus' scores (Hedström et al. 2023, "The meta-evaluation problem in explainable AI", TMLR, sec. 4, eq. 6-9)
  from a metric's scores ``q`` ``[methods, samples]`` before and ``q_hat`` after a perturbation (of the model or the
  input; resilience: a minor one, adversary: a disruptive one; the caller keeps the samples whose prediction is
  unchanged, resp. changed): :func:`iac` (intra-consistency: the Wilcoxon p-value of ``q`` against ``q_hat``, zero
  differences split, for resilience; ``1 - p`` for adversary), :func:`iec_resilience` (inter-consistency: the share
  of (sample, rank position) where the same method holds the position) and :func:`iec_adversary` (the share of
  (method, sample) where ``q_hat`` is worse than ``q`` **in the metric's declared direction**, ``higher_is_better``
  a bool: a string or ``None`` is refused, since upstream's truthiness test of its ``lower_is_better`` is what
  inverts this score for higher-is-better metrics, MetaQuantus PR #10), and :func:`meta_consistency`, their mean;
* :func:`random_separation`: per method, whether its per-sample scores differ from the random map's under one
  metric: Wilcoxon's signed-rank test (Wilcoxon 1945; zero differences dropped, the normal approximation with the
  tie correction of the variance, two-sided, no continuity correction), Holm's step-down correction over the
  methods (Holm 1979, Scand. J. Stat. 6(2)), at ``alpha``.
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values`` in increasing order, ties sharing their mean rank."""
    unique, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    below = np.cumsum(counts) - counts
    return (below + (counts + 1) / 2.0)[inverse]


def _oriented(scores: Sequence[float], higher_is_better: Optional[bool], name: str = "metric") -> np.ndarray:
    if higher_is_better is None:
        raise ValueError(f"{name}: a metric without a declared direction (higher_is_better None) ranks nothing")
    values = np.asarray(scores, dtype=np.float64)
    if values.ndim != 1 or not np.all(np.isfinite(values)):
        raise ValueError(f"{name}: needs one finite score per method, got {values.tolist()}")
    return values if higher_is_better else -values


def method_ranks(scores: Sequence[float], higher_is_better: Optional[bool], name: str = "metric") -> np.ndarray:
    """``[n]`` rank of each method (1 = best) under one metric (module docstring)."""
    return _average_ranks(-_oriented(scores, higher_is_better, name))


def kendalls_w(rankings: np.ndarray) -> float:
    """Kendall's W of ``rankings`` ``[m raters, n methods]`` (ranks or scores; each row is re-ranked, ties
    averaged), tie-corrected (module docstring). Fewer than 2 raters or methods is a ``ValueError``."""
    table = np.asarray(rankings, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 2 or table.shape[1] < 2:
        raise ValueError(f"kendalls_w: needs [raters >= 2, methods >= 2] rankings, got shape {table.shape}")
    m, n = table.shape
    ranks = np.stack([_average_ranks(row) for row in table])
    sums = ranks.sum(axis=0)
    s = float(((sums - sums.mean()) ** 2).sum())
    ties = sum(float((c ** 3 - c).sum()) for c in (np.unique(row, return_counts=True)[1] for row in ranks))
    denominator = m * m * (n ** 3 - n) - m * ties
    return 12.0 * s / denominator if denominator > 0 else float("nan")


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two score vectors: ``(C - D) / sqrt((P - X) (P - Y))``, ``C`` / ``D`` the concordant /
    discordant pairs, ``P`` all pairs, ``X`` / ``Y`` the pairs tied in x / in y (NaN when one vector is constant)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"kendall_tau_b: two vectors of one length, got {a.shape} and {b.shape}")
    i, j = np.triu_indices(a.size, k=1)
    sa, sb = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    numerator = float((sa * sb).sum())
    denominator = float(np.sqrt(np.count_nonzero(sa) * np.count_nonzero(sb)))
    return numerator / denominator if denominator > 0 else float("nan")


def metric_agreement(scores: Mapping[str, Sequence[float]], higher_is_better: Mapping[str, Optional[bool]]
                     ) -> Tuple[List[str], np.ndarray, List[Tuple[str, str]]]:
    """``(metric names, [k, k] tau-b matrix, contradictory pairs)`` of the metrics' method scores (each a vector over
    the same methods in one order), oriented to higher-is-better; a pair with tau < 0 is contradictory."""
    names = list(scores)
    oriented = {name: _oriented(scores[name], higher_is_better.get(name), name) for name in names}
    sizes = {v.size for v in oriented.values()}
    if len(sizes) > 1:
        raise ValueError(f"metric_agreement: every metric needs a score for the same methods, got sizes {sizes}")
    table = np.array([[kendall_tau_b(oriented[a], oriented[b]) for b in names] for a in names])
    contradictory = [(a, b) for k, a in enumerate(names) for b in names[k + 1:]
                     if table[k, names.index(b)] < 0]
    return names, table, contradictory


def bootstrap_rank_intervals(per_sample: np.ndarray, higher_is_better: Optional[bool], resamples: int = 1000,
                             seed: int = 0, level: float = 0.95) -> Dict[str, np.ndarray]:
    """Bootstrap of each method's rank under one metric from its per-sample scores ``[N samples, M methods]``
    (module docstring): ``{"mean_rank": [M], "low": [M], "high": [M]}`` (the ``level`` percentile interval)."""
    table = np.asarray(per_sample, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] < 2:
        raise ValueError(f"bootstrap_rank_intervals: needs [samples, methods >= 2] scores, got shape {table.shape}")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"bootstrap_rank_intervals: resamples >= 1 and level in (0, 1), got {resamples}, {level}")
    table = table[np.all(np.isfinite(table), axis=1)]
    if table.shape[0] == 0:
        raise ValueError("bootstrap_rank_intervals: no sample has a finite score for every method")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 35]))
    ranks = np.empty((resamples, table.shape[1]))
    for r in range(resamples):
        rows = rng.integers(0, table.shape[0], table.shape[0])
        ranks[r] = method_ranks(table[rows].mean(axis=0), higher_is_better)
    tail = (1 - level) / 2 * 100
    return {"mean_rank": ranks.mean(axis=0), "low": np.percentile(ranks, tail, axis=0),
            "high": np.percentile(ranks, 100 - tail, axis=0)}


def wilcoxon_p(x: Sequence[float], y: Sequence[float], zero_split: bool = False) -> float:
    """Two-sided p-value of Wilcoxon's signed-rank test of paired ``x`` and ``y`` (module docstring); NaN pairs are
    left out, and NaN is returned when no difference is left. ``zero_split``: zero differences are kept and half of
    their ranks counted as positive (Pratt's ranks split; scipy's ``zsplit``) instead of dropped."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    d = (a - b)[np.isfinite(a) & np.isfinite(b)]
    if not zero_split:
        d = d[d != 0]
    n = d.size
    if n == 0 or not np.any(d):
        return float("nan")
    ranks = _average_ranks(np.abs(d))
    w_plus = float(ranks[d > 0].sum()) + 0.5 * float(ranks[d == 0].sum())
    ties = float(sum(c ** 3 - c for c in np.unique(ranks, return_counts=True)[1]))
    variance = n * (n + 1) * (2 * n + 1) / 24.0 - ties / 48.0
    if variance <= 0:
        return float("nan")
    z = (w_plus - n * (n + 1) / 4.0) / math.sqrt(variance)
    return math.erfc(abs(z) / math.sqrt(2.0))


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count as a test)."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full_like(p, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (order.size - k) * p[i]))
        out[i] = running
    return out


def random_separation(per_sample: Mapping[str, Sequence[float]], random: str = "random", alpha: float = 0.05
                      ) -> Dict[str, Dict[str, float]]:
    """``{method: {"p": raw p, "p_holm": adjusted p, "differs": 1.0 / 0.0}}`` for every method but ``random``,
    each method's per-sample scores paired with the random map's on the same samples (module docstring)."""
    if random not in per_sample:
        raise KeyError(f"random_separation: no scores of the random map {random!r}; have {sorted(per_sample)}")
    if not 0 < alpha < 1:
        raise ValueError(f"random_separation: alpha must lie in (0, 1), got {alpha}")
    methods = [m for m in per_sample if m != random]
    raw = [wilcoxon_p(per_sample[m], per_sample[random]) for m in methods]
    adjusted = holm(raw)
    return {m: {"p": raw[k], "p_holm": float(adjusted[k]), "differs": float(adjusted[k] < alpha)}
            for k, m in enumerate(methods)}


def krippendorff_alpha_interval(values: np.ndarray) -> float:
    """Krippendorff's interval alpha of ``values`` ``[coders >= 2, units]`` (complete data; module docstring): the
    observed disagreement within units over the expected disagreement between all values (NaN when every value is
    the same)."""
    table = np.asarray(values, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 2 or table.shape[1] < 1 or not np.all(np.isfinite(table)):
        raise ValueError(f"krippendorff_alpha_interval: needs finite [coders >= 2, units >= 1] values, got shape "
                         f"{table.shape}")
    m, _ = table.shape
    n = table.size
    within = sum(float(((u[:, None] - u[None, :]) ** 2).sum()) for u in table.T) / (m - 1)
    flat = table.ravel()
    between = float(((flat[:, None] - flat[None, :]) ** 2).sum())
    if between == 0:
        return float("nan")
    return 1.0 - (within / n) / (between / (n * (n - 1)))


def cronbach_alpha(scores: np.ndarray) -> float:
    """Cronbach's alpha of ``scores`` ``[observations >= 2, variants >= 2]`` (module docstring; NaN when the sum of
    the variants does not vary)."""
    table = np.asarray(scores, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 2 or table.shape[1] < 2 or not np.all(np.isfinite(table)):
        raise ValueError(f"cronbach_alpha: needs finite [observations >= 2, variants >= 2] scores, got shape "
                         f"{table.shape}")
    k = table.shape[1]
    total = float(table.sum(axis=1).var(ddof=1))
    if total == 0:
        return float("nan")
    return k / (k - 1) * (1.0 - float(table.var(axis=0, ddof=1).sum()) / total)


KINDS = ("resilience", "adversary")


def _scores_pair(q: np.ndarray, q_hat: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(q, dtype=np.float64), np.asarray(q_hat, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"meta-evaluation: q and q_hat must be [methods, samples >= 1] of one shape, got {a.shape} "
                         f"and {b.shape}")
    return a, b


def iac(q: Sequence[float], q_hat: Sequence[float], kind: str) -> float:
    """Intra-consistency of one method's scores ``q`` / ``q_hat`` ``[samples]`` under a ``resilience`` (the Wilcoxon
    p-value, zero differences split) or an ``adversary`` (``1 - p``) perturbation; a perturbation that changes no
    score counts as p = 1."""
    if kind not in KINDS:
        raise ValueError(f"iac: kind must be one of {KINDS}, got {kind!r}")
    p = wilcoxon_p(q, q_hat, zero_split=True)
    p = 1.0 if p != p else p
    return p if kind == "resilience" else 1.0 - p


def iec_resilience(q: np.ndarray, q_hat: np.ndarray) -> float:
    """Share of (sample, rank position) whose method is the same before and after (ties in method order)."""
    a, b = _scores_pair(q, q_hat)
    before, after = np.argsort(a, axis=0, kind="stable"), np.argsort(b, axis=0, kind="stable")
    return float((before == after).mean())


def iec_adversary(q: np.ndarray, q_hat: np.ndarray, higher_is_better: bool) -> float:
    """Share of (method, sample) whose perturbed score is worse in the declared direction (module docstring)."""
    if not isinstance(higher_is_better, (bool, np.bool_)):
        raise TypeError(f"iec_adversary: higher_is_better must be a bool, got {higher_is_better!r}: a string or None "
                        f"would be read by its truthiness (MetaQuantus PR #10)")
    a, b = _scores_pair(q, q_hat)
    worse = b < a if higher_is_better else b > a
    return float(worse.mean())


def meta_consistency(iac_nr: float, iac_ar: float, iec_nr: float, iec_ar: float) -> float:
    """MetaQuantus' MC: the mean of the four scores, each in [0, 1] (1: resilient to noise, reactive to adversaries)."""
    return (iac_nr + iac_ar + iec_nr + iec_ar) / 4.0
