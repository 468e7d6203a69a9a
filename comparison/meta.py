"""Meta-evaluation of the metrics of one or several runs: can a table of results be trusted?

A *metric* here is one result-key family across methods: a test, class setting and metric
(:func:`comparison.tables.parse_key`), e.g. ``perturbation / predicted / positive AUC`` over every method; the
``accuracy``, ``sanity`` (reported in :func:`sanity_table`) and pairwise keys are no metric of methods. Every
measure reads the metric's declared direction (``higher_is_better`` of ``metrics.meta.json``); a metric without
one is left out. The measures are those of :mod:`evaluation.meta_evaluation`:

* **ranking** per run: each method's rank (1 = best) from the run's scalars;
* **agreement**: Kendall's tau-b between every pair of metrics' method scores (oriented to higher-is-better, on
  the methods both score, at least 3), per run, then averaged over the runs; a pair with mean tau < 0 is
  *contradictory*;
* **reliability**: Krippendorff's interval alpha of the per-sample method rankings (the samples as coders of the
  methods' ranks; from the run's ``per_sample.npz``, the samples every method scored finitely); below
  :data:`RELIABILITY_MIN` (Krippendorff 2004's lowest value for tentative conclusions) the metric is *unreliable*;
* **stability**: Kendall's W of the method ranking across the runs that differ only in seeds (config keys named
  ``*seed*``, the run folder keys ``output_dir`` / ``default_root_dir`` ignored; runs without a config form one
  group), below :data:`STABILITY_MIN` the metric is *unstable*; and the
  bootstrap interval of each method's rank from the per-sample values;
* **separation** from the random map: Wilcoxon signed-rank per method against ``random`` on the same samples, Holm
  corrected at :data:`ALPHA`; a metric under which no method differs from the random map *does not separate*;
* **oracle**: where a method ``oracle`` (the ground truth as a map) is scored, a metric that does not rank it first
  fails *oracle first*.

Each failed rule is a :class:`Failure` (the rule and what was measured), the marks of the dashboard's tables.
"""
from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from comparison.runs import Run, RunLoadError
from comparison.tables import RANDOM, parse_key
from evaluation.meta_evaluation import (
    bootstrap_rank_intervals,
    kendall_tau_b,
    kendalls_w,
    krippendorff_alpha_interval,
    method_ranks,
    random_separation,
)
from evaluation.reporting import PER_SAMPLE_FILE, read_per_sample

#: Krippendorff (2004, Content Analysis, sec. 11.4): alpha >= 0.667 is the lowest for tentative conclusions
RELIABILITY_MIN = 0.667
#: Kendall's W below which a method ranking is called unstable across seeds (strong agreement from 0.7)
STABILITY_MIN = 0.7
#: family-wise level of the Holm-corrected Wilcoxon tests against the random map
ALPHA = 0.05
ORACLE = "oracle"
#: tests whose keys are no metric of methods
NOT_METRICS = ("accuracy", "sanity")
BOOTSTRAP_RESAMPLES = 200

Family = Tuple[str, str, str]   # (test, setting, metric)


@dataclass
class Failure:
    rule: str      # "unreliable", "unstable", "no separation", "oracle not first"
    detail: str


@dataclass
class MetricMeta:
    """The meta-evaluation of one metric (module docstring)."""

    family: Family
    higher_is_better: bool
    keys: Dict[str, str]                                       # method -> result key
    ranks: Dict[str, Dict[str, float]] = field(default_factory=dict)          # run -> method -> rank
    reliability: Dict[str, float] = field(default_factory=dict)               # run -> Krippendorff's alpha
    samples: Dict[str, int] = field(default_factory=dict)                     # run -> samples used
    stability: Dict[str, float] = field(default_factory=dict)                 # seed group -> Kendall's W
    #: run -> method -> (mean rank, low, high) of the bootstrap
    intervals: Dict[str, Dict[str, Tuple[float, float, float]]] = field(default_factory=dict)
    separated: Dict[str, Dict[str, bool]] = field(default_factory=dict)       # run -> method -> differs from random
    #: run -> whether its samples could separate a method at all (:func:`can_separate`)
    powered: Dict[str, bool] = field(default_factory=dict)
    oracle_rank: Dict[str, float] = field(default_factory=dict)               # run -> the oracle's rank
    failures: List[Failure] = field(default_factory=list)

    @property
    def name(self) -> str:
        return family_name(self.family)


@dataclass
class MetaReport:
    metrics: List[MetricMeta]
    agreement_names: List[str]
    agreement: np.ndarray                       # [k, k] mean tau-b over the runs (NaN: never comparable)
    contradictory: List[Tuple[str, str]]
    groups: Dict[str, List[str]]                # seed group -> run names

    def failures(self) -> Dict[Family, List[Failure]]:
        return {m.family: m.failures for m in self.metrics if m.failures}


def family_name(family: Family) -> str:
    return " / ".join(part for part in family if part)


def metric_families(runs: Sequence[Run]) -> Dict[Family, Tuple[Dict[str, str], Optional[bool]]]:
    """``{family: ({method: key}, higher_is_better)}`` of every metric of methods in ``runs``; a family whose
    methods declare different directions gets ``None``."""
    out: Dict[Family, Tuple[Dict[str, str], set]] = {}
    for run in runs:
        for key, value in run.metrics.items():
            info = parse_key(key)
            if isinstance(value, list) or info is None or info.test in NOT_METRICS or info.row in ("-", "model") \
                    or " vs " in info.row:
                continue
            keys, directions = out.setdefault((info.test, info.setting, info.metric), ({}, set()))
            keys.setdefault(info.row, key)
            directions.add(run.higher_is_better.get(key))
    return {f: (keys, next(iter(d)) if len(d) == 1 else None) for f, (keys, d) in out.items()}


#: config keys that name where a run was written, not how it was computed
LOCATION_KEYS = ("output_dir", "default_root_dir")


def _strip_seeds(config: Any) -> Any:
    if isinstance(config, Mapping):
        return {k: _strip_seeds(v) for k, v in config.items()
                if "seed" not in str(k).lower() and str(k) not in LOCATION_KEYS}
    if isinstance(config, list):
        return [_strip_seeds(v) for v in config]
    return config


def seed_groups(runs: Sequence[Run]) -> Dict[str, List[str]]:
    """Runs grouped by their config with every ``*seed*`` key and :data:`LOCATION_KEYS` removed
    (``{label: [run names]}``); the label is the group's first run's name."""
    groups: Dict[str, List[str]] = {}
    for run in runs:
        signature = json.dumps(_strip_seeds(run.config), sort_keys=True, default=str) if run.config else ""
        groups.setdefault(signature, []).append(run.name)
    return {names[0]: names for names in groups.values()}


def per_sample_of(run: Run) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    """The run's per-sample sidecar (``{}`` when it has none: not a run folder, or no per-sample scores); a
    corrupt one is a :class:`RunLoadError` naming the file."""
    path = Path(run.source) / PER_SAMPLE_FILE
    if run.kind != "folder" or not path.is_file():
        return {}
    try:
        return read_per_sample(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        raise RunLoadError(f"{path}: corrupt per-sample sidecar ({err})") from None


def sample_matrix(per_sample: Mapping[str, Tuple[np.ndarray, np.ndarray]], keys: Mapping[str, str]
                  ) -> Tuple[List[str], np.ndarray]:
    """``(methods, [N, M] values)``: the methods with one value per sample in the sidecar, on the samples every
    one of them scored finitely (rows in index order)."""
    methods = [m for m, k in keys.items() if k in per_sample and np.asarray(per_sample[k][1]).ndim == 1]
    if len(methods) < 2:
        return methods, np.zeros((0, len(methods)))
    common = per_sample[keys[methods[0]]][0]
    for m in methods[1:]:
        common = np.intersect1d(common, per_sample[keys[m]][0])
    columns = []
    for m in methods:
        index, values = per_sample[keys[m]]
        position = {int(i): p for p, i in enumerate(index)}
        columns.append(np.asarray(values, dtype=np.float64)[[position[int(i)] for i in common]])
    table = np.stack(columns, axis=1) if common.size else np.zeros((0, len(methods)))
    return methods, table[np.all(np.isfinite(table), axis=1)]


def _scores(run: Run, keys: Mapping[str, str]) -> Dict[str, float]:
    out = {}
    for method, key in keys.items():
        value = run.scalar(key)
        if value is not None and math.isfinite(value):
            out[method] = value
    return out


def _per_sample_measures(meta: MetricMeta, run: Run, per_sample: Mapping[str, Tuple[np.ndarray, np.ndarray]],
                         seed: int) -> None:
    methods, table = sample_matrix(per_sample, meta.keys)
    if len(methods) < 2 or table.shape[0] < 2:
        return
    hib = meta.higher_is_better
    meta.samples[run.name] = int(table.shape[0])
    ranks = np.stack([method_ranks(row, hib) for row in table])
    meta.reliability[run.name] = krippendorff_alpha_interval(ranks)
    boot = bootstrap_rank_intervals(table, hib, resamples=BOOTSTRAP_RESAMPLES, seed=seed)
    meta.intervals[run.name] = {m: (float(boot["mean_rank"][i]), float(boot["low"][i]), float(boot["high"][i]))
                                for i, m in enumerate(methods)}
    if RANDOM in methods:
        tests = random_separation({m: table[:, i] for i, m in enumerate(methods)}, RANDOM, ALPHA)
        meta.separated[run.name] = {m: bool(r["differs"]) for m, r in tests.items()}
        meta.powered[run.name] = can_separate(table.shape[0], len(tests))


def can_separate(samples: int, tests: int, alpha: float = ALPHA) -> bool:
    """Whether ``samples`` paired differences can reach Holm's first threshold ``alpha / tests`` at all: the
    smallest two-sided p of the signed-rank statistic (every difference of one sign, no ties; the normal
    approximation :func:`evaluation.meta_evaluation.wilcoxon_p` uses) times ``tests`` below ``alpha``."""
    n = samples
    if n < 1 or tests < 1:
        return False
    z = (n * (n + 1) / 4.0) / math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    return tests * math.erfc(z / math.sqrt(2.0)) < alpha


def _judge(meta: MetricMeta) -> None:
    for run, alpha in meta.reliability.items():
        if not alpha >= RELIABILITY_MIN:
            meta.failures.append(Failure("unreliable", f"Krippendorff's alpha {alpha:.3f} < {RELIABILITY_MIN} "
                                                       f"in {run}"))
    for group, w in meta.stability.items():
        if not w >= STABILITY_MIN:
            meta.failures.append(Failure("unstable", f"Kendall's W {w:.3f} < {STABILITY_MIN} across the seeds of "
                                                     f"{group}"))
    for run, separated in meta.separated.items():
        if separated and not any(separated.values()) and meta.powered.get(run, True):
            meta.failures.append(Failure("no separation", f"no method differs from the random map (Wilcoxon, "
                                                          f"Holm, alpha {ALPHA}) in {run}"))
    for run, rank in meta.oracle_rank.items():
        if rank != 1.0:
            meta.failures.append(Failure("oracle not first", f"the oracle ranks {rank:g} in {run}"))


def _agreement(metrics: Sequence[MetricMeta], runs: Sequence[Run]
               ) -> Tuple[List[str], np.ndarray, List[Tuple[str, str]]]:
    names = [m.name for m in metrics]
    k = len(metrics)
    sums, counts = np.zeros((k, k)), np.zeros((k, k))
    for run in runs:
        oriented = [{m: (v if meta.higher_is_better else -v) for m, v in _scores(run, meta.keys).items()}
                    for meta in metrics]
        for a in range(k):
            for b in range(k):
                common = sorted(set(oriented[a]) & set(oriented[b]))
                if len(common) < 3:
                    continue
                tau = kendall_tau_b([oriented[a][m] for m in common], [oriented[b][m] for m in common])
                if math.isfinite(tau):
                    sums[a, b] += tau
                    counts[a, b] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        table = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    contradictory = [(names[a], names[b]) for a in range(k) for b in range(a + 1, k) if table[a, b] < 0]
    return names, table, contradictory


def meta_evaluate(runs: Sequence[Run], seed: int = 0) -> MetaReport:
    """The meta-evaluation of every metric of methods in ``runs`` (module docstring); ``seed`` draws the
    bootstrap resamples."""
    groups = seed_groups(runs)
    sidecars = {run.name: per_sample_of(run) for run in runs}
    metrics: List[MetricMeta] = []
    for family, (keys, hib) in sorted(metric_families(runs).items()):
        if hib is None or len(keys) < 2:
            continue
        meta = MetricMeta(family, hib, dict(sorted(keys.items())))
        for run in runs:
            scores = _scores(run, meta.keys)
            if len(scores) >= 2:
                ranks = method_ranks(list(scores.values()), hib, meta.name)
                meta.ranks[run.name] = dict(zip(scores, map(float, ranks)))
                if ORACLE in scores:
                    meta.oracle_rank[run.name] = meta.ranks[run.name][ORACLE]
            _per_sample_measures(meta, run, sidecars[run.name], seed)
        for label, names in groups.items():
            ranked = [meta.ranks[n] for n in names if n in meta.ranks]
            common = sorted(set.intersection(*map(set, ranked))) if ranked else []
            if len(ranked) >= 2 and len(common) >= 2:
                meta.stability[label] = kendalls_w(np.array([[r[m] for m in common] for r in ranked]))
        _judge(meta)
        metrics.append(meta)
    names, table, contradictory = _agreement(metrics, runs)
    return MetaReport(metrics, names, table, contradictory, groups)


# ------------------------------------------------------------------------------------------ sanity checks
def sanity_table(runs: Sequence[Run]) -> Dict[Tuple[str, str], Dict[str, Optional[float]]]:
    """``{(method, check): {run: 1.0 pass / 0.0 fail / NaN not judged / None absent}}`` of the runs'
    ``sanity/<method>/<setting>/<check>_pass`` keys (the check named with its class setting)."""
    out: Dict[Tuple[str, str], Dict[str, Optional[float]]] = {}
    for run in runs:
        for key, value in run.metrics.items():
            info = parse_key(key)
            if info is None or info.test != "sanity" or not info.metric.endswith("_pass"):
                continue
            check = info.metric[: -len("_pass")] + (f" ({info.setting})" if info.setting else "")
            out.setdefault((info.row, check), {})[run.name] = (float("nan") if value is None else float(value))
    return {k: {r.name: v.get(r.name) for r in runs} for k, v in sorted(out.items())}


# ------------------------------------------------------------------------------------------ Markdown
def _md(text: object) -> str:
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            .replace("\n", " "))


def _joined(values: Mapping[str, float], fmt: str = ".3f") -> str:
    return "; ".join(f"{_md(k)} {format(v, fmt) if math.isfinite(v) else 'NaN'}" for k, v in values.items())


def meta_markdown(report: MetaReport) -> str:
    """The stability / reliability table and the contradictory pairs as Markdown (run data escaped)."""
    lines = ["| metric | better | Kendall's W (seed group) | Krippendorff's alpha (run) | methods separated from "
             "random (run) | oracle rank (run) | fails |", "|---|---|---|---|---|---|---|"]
    for m in report.metrics:
        separated = "; ".join(f"{_md(run)} {sum(s.values())}/{len(s)}"
                              + ("" if m.powered.get(run, True) else " (too few samples: not judged)")
                              for run, s in m.separated.items())
        rules = ", ".join(dict.fromkeys(f.rule for f in m.failures)) or "-"
        lines.append(f"| {_md(m.name)} | {'higher' if m.higher_is_better else 'lower'} | {_joined(m.stability)} | "
                     f"{_joined(m.reliability)} | {separated} | {_joined(m.oracle_rank, 'g')} | {rules} |")
    pairs = [f"- {_md(a)} vs {_md(b)}" for a, b in report.contradictory]
    return ("\n".join(lines) + "\n\nContradictory metric pairs (mean Kendall's tau-b < 0): "
            + ("\n\n" + "\n".join(pairs) if pairs else "none") + "\n")
