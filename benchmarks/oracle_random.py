"""Issue 34's sanity criterion on a ground-truth benchmark: does the oracle map (the ground truth as a method,
``oracle: true`` in the catalogue configs) score better than every method, and the random map worse than every
class-specific method, on the faithfulness and localisation keys?

    python -m benchmarks.oracle_random RUN_FOLDER [RUN_FOLDER ...] [--class-agnostic rollout raw_attention]
        [--by-test] [--samples INDICES.json]

Reads each run's ``metrics.json`` and the direction each key declares in ``metrics.meta.json``
(``higher_is_better``); a key counts when its test is one of :data:`TESTS` (localisation, faithfulness
correlation, SaCo, tau-LOO and the removal curves; not complexity, robustness or completeness, which are no
faithfulness or localisation measure of a ground truth) and it has a direction (curves and counts have none).
A pair (key, method) is a hit when the random map is strictly worse than the method (class-specific methods
only: the random map, ``--class-agnostic`` and the oracle are left out) and, for the oracle, when it is strictly
better than the method (ties are counted apart). Prints the shares and every exception as markdown.

``--samples``: a JSON list of dataset indices; each key's value is then the mean of its per-sample values over those
samples (the run's ``per_sample.npz``) instead of the run's value. A key counts only where the mean over all of its
samples reproduces the run's value (within 1e-9) and its conventions declare no per-class mean: a key that is no
plain mean of per-sample values (the class-mean pointing game) or has none in the sidecar is left out and named.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from evaluation.reporting import read_per_sample

#: the tests whose keys are faithfulness or localisation measures
TESTS = ("localisation", "faithfulness_correlation", "saco", "tau_loo", "rise", "rise_pixel", "morf_lerf", "road",
         "aopc")
RANDOM, ORACLE = "random", "oracle"


def counted(key: str) -> bool:
    """Whether ``key`` names a (test, method, setting, metric) result of one of :data:`TESTS`."""
    parts = key.split("/")
    return len(parts) == 4 and parts[0] in TESTS


def class_mean(meta: Dict[str, object], key: str) -> bool:
    """Whether ``key``'s conventions in ``metrics.meta.json`` declare a per-class mean (``<metric>_mean``: ``per
    class, ...``; the pointing game)."""
    entry = meta.get(key)
    conventions = entry.get("conventions", {}) if isinstance(entry, dict) else {}
    rule = conventions.get(f"{key.split('/')[-1]}_mean") if isinstance(conventions, dict) else None
    return isinstance(rule, str) and rule.startswith("per class")


def subset_means(folder: Path, metrics: Dict[str, object], samples: Sequence[int],
                 meta: Optional[Dict[str, object]] = None) -> Tuple[Dict[str, float], List[str]]:
    """The counted scalar keys of a run as means over the dataset indices ``samples`` of their per-sample values,
    and the keys left out (no per-sample values, a per-class mean declared in ``meta``, the run's
    ``metrics.meta.json`` entries, or a mean over every sample that is not the run's value)."""
    path = folder / "per_sample.npz"
    if not path.is_file():
        raise FileNotFoundError(f"--samples needs each run's per-sample scores: {path} is missing")
    rows = read_per_sample(path)
    wanted = np.asarray(sorted(set(int(i) for i in samples)), dtype=np.int64)
    out: Dict[str, float] = {}
    left_out: List[str] = []
    for key, value in metrics.items():
        if not counted(key) or not isinstance(value, (int, float)):
            continue
        if key not in rows or np.asarray(rows[key][1]).ndim != 1 or class_mean(meta or {}, key):
            left_out.append(key)
            continue
        index, values = np.asarray(rows[key][0]), np.asarray(rows[key][1], dtype=np.float64)
        if not np.isclose(np.nanmean(values), float(value), rtol=1e-9, atol=1e-12):
            left_out.append(key)
            continue
        missing = np.setdiff1d(wanted, index)
        if missing.size:
            raise ValueError(f"--samples: {key} of {folder} has no value for the dataset indices "
                             f"{missing[:10].tolist()}{' ...' if missing.size > 10 else ''} (the run has "
                             f"{index.size} samples)")
        out[key] = float(np.nanmean(values[np.isin(index, wanted)]))
    return out, left_out


def read_runs(folders: Sequence[Path], samples: Optional[Sequence[int]] = None
              ) -> Tuple[Dict[str, float], Dict[str, Optional[bool]], List[str]]:
    """The scalar results and declared directions of every run folder, merged, and the keys left out. A key in two
    runs is an error unless it has the same value in both (the clean ``accuracy`` of two runs on the same model and
    data). With ``samples``, the counted keys are their means over those samples (:func:`subset_means`)."""
    values: Dict[str, float] = {}
    directions: Dict[str, Optional[bool]] = {}
    left_out: List[str] = []
    for folder in folders:
        metrics = json.loads((folder / "metrics.json").read_text())
        meta = json.loads((folder / "metrics.meta.json").read_text())["metrics"]
        if samples is not None:
            means, dropped = subset_means(folder, metrics, samples, meta)
            metrics = {k: v for k, v in metrics.items() if not counted(k) or k in means}
            metrics.update(means)
            left_out += dropped
        for key, value in metrics.items():
            if not isinstance(value, (int, float)):
                continue
            if key in values and values[key] != float(value):
                raise ValueError(f"{key} is in more than one of the runs {[str(f) for f in folders]}, with "
                                 f"different values ({values[key]} and {float(value)})")
            values[key] = float(value)
            directions[key] = meta.get(key, {}).get("higher_is_better")
    return values, directions, sorted(left_out)


def keyed(values: Dict[str, float], directions: Dict[str, Optional[bool]]
          ) -> Dict[Tuple[str, str, str], Dict[str, Tuple[float, bool]]]:
    """``{(test, setting, metric): {method: (value, higher_is_better)}}`` of the counted keys."""
    out: Dict[Tuple[str, str, str], Dict[str, Tuple[float, bool]]] = {}
    for key, value in values.items():
        parts = key.split("/")
        hib = directions.get(key)
        if len(parts) != 4 or parts[0] not in TESTS or hib is None or value != value:
            continue
        test, method, setting, metric = parts
        out.setdefault((test, setting, metric), {})[method] = (value, bool(hib))
    return out


def better(a: float, b: float, hib: bool) -> bool:
    return a > b if hib else a < b


def tally(table, class_agnostic: Sequence[str]) -> Dict[str, object]:
    """Hits, pairs and exceptions of the random map and of the oracle."""
    random_pairs, random_misses, oracle_pairs, oracle_ties, oracle_misses = 0, [], 0, [], []
    for (test, _setting, metric), methods in sorted(table.items()):
        name = f"{test}/{metric}"
        others = {m: v for m, v in methods.items() if m not in (RANDOM, ORACLE)}
        if RANDOM in methods:
            r, hib = methods[RANDOM]
            for m, (v, _) in sorted(others.items()):
                if m in class_agnostic:
                    continue
                random_pairs += 1
                if not better(v, r, hib):
                    random_misses.append(f"{name}: {m} {v:.3f} vs random {r:.3f}")
        if ORACLE in methods:
            o, hib = methods[ORACLE]
            for m, (v, _) in sorted(dict(others, **({RANDOM: methods[RANDOM]} if RANDOM in methods else {}))
                                    .items()):
                oracle_pairs += 1
                if v == o:
                    oracle_ties.append(f"{name}: {m} {v:.3f}")
                elif not better(o, v, hib):
                    oracle_misses.append(f"{name}: {m} {v:.3f} vs oracle {o:.3f}")
    return {"random_pairs": random_pairs, "random_misses": random_misses, "oracle_pairs": oracle_pairs,
            "oracle_ties": oracle_ties, "oracle_misses": oracle_misses}


def report(counts: Dict[str, object]) -> List[str]:
    rp, rm = int(counts["random_pairs"]), list(counts["random_misses"])          # type: ignore[arg-type]
    op, ot, om = int(counts["oracle_pairs"]), list(counts["oracle_ties"]), list(counts["oracle_misses"])  # type: ignore[arg-type]
    lines = []
    if rp:
        lines.append(f"- random map worse than every class-specific method: {rp - len(rm)} of {rp} pairs "
                     f"({100.0 * (rp - len(rm)) / rp:.1f} %); exceptions: " + ("; ".join(rm) or "none"))
    if op:
        lines.append(f"- oracle strictly better than the method: {op - len(ot) - len(om)} of {op} pairs "
                     f"({100.0 * (op - len(ot) - len(om)) / op:.1f} %), tied {len(ot)}, not better {len(om)} "
                     f"({100.0 * (op - len(om)) / op:.1f} % better or tied); not better: " + ("; ".join(om) or "none"))
    return lines


def by_test(table, class_agnostic: Sequence[str]) -> List[str]:
    """One line per test: its random-map and oracle shares (where the exceptions are concentrated)."""
    lines = []
    for test in sorted({key[0] for key in table}):
        c = tally({k: v for k, v in table.items() if k[0] == test}, class_agnostic)
        rp, rm = int(c["random_pairs"]), len(c["random_misses"])                   # type: ignore[arg-type]
        op, ot, om = int(c["oracle_pairs"]), len(c["oracle_ties"]), len(c["oracle_misses"])  # type: ignore[arg-type]
        lines.append(f"  - {test}: random worse {rp - rm} of {rp}; oracle strictly better {op - ot - om} of {op}, "
                     f"tied {ot}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> List[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (metrics.json, metrics.meta.json)")
    parser.add_argument("--class-agnostic", nargs="*", default=["rollout", "raw_attention"],
                        help="methods whose map ignores the explained class (left out of the random-map count)")
    parser.add_argument("--by-test", action="store_true", help="add one line of counts per test")
    parser.add_argument("--samples", type=Path, default=None,
                        help="a JSON list of dataset indices: count the means over these samples (per_sample.npz)")
    args = parser.parse_args(argv)
    samples = None
    if args.samples is not None:
        samples = json.loads(args.samples.read_text())
        if not isinstance(samples, list) or not samples or not all(isinstance(i, int) for i in samples):
            raise ValueError(f"--samples {args.samples}: expected a non-empty JSON list of dataset indices")
    values, directions, left_out = read_runs(args.runs, samples)
    table = keyed(values, directions)
    lines = report(tally(table, args.class_agnostic))
    if samples is not None:
        lines.append(f"- {len(samples)} samples; left out (no plain mean of per-sample values): "
                     + ("; ".join(left_out) or "none"))
    if args.by_test:
        lines += by_test(table, args.class_agnostic)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
