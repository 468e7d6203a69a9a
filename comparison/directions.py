"""Which direction is better for every metric of a run, declared the way the evaluation run declares it.

``metrics.json`` holds values only. The run's callbacks declared each key's ``higher_is_better`` (from their
torchmetrics metrics: :class:`evaluation.metrics.PositivePerturbationCurve` lower, ``NegativePerturbationCurve``
higher, :class:`evaluation.segmentation.SegmentationMetrics` higher, the CDAM analysis' own declarations, ...).
:func:`declared_directions` asks the same callbacks again: it builds each test's callback for the methods, class
settings and directions named in the keys and reads its ``higher_is_better()``; nothing is guessed here. Keys no
callback declares get ``None`` (no direction: no best is marked).
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional


def declared_directions(keys: Iterable[str]) -> Dict[str, Optional[bool]]:
    """``{key: True | False | None}`` for ``keys`` (metrics.json keys), from the callbacks' declarations."""
    from callbacks.accuracy import CleanAccuracyTest
    from callbacks.cdam_analysis import CDAMAnalysis
    from callbacks.faithfulness import ERASERFaithfulnessTest
    from callbacks.perturbation import PerturbationTest
    from callbacks.rationale import RationaleTest
    from callbacks.segmentation import SegmentationTest

    keys = list(keys)
    declared: Dict[str, Optional[bool]] = {}
    declared.update(CleanAccuracyTest().higher_is_better())

    pert = [k.split("/") for k in keys if k.startswith("perturbation/") and len(k.split("/")) == 5]
    if pert:
        methods = sorted({p[1] for p in pert})
        directions = sorted({p[2] for p in pert} & {"positive", "negative"})
        settings = sorted({p[3] for p in pert} & {"predicted", "target", "other"})
        if directions and settings:
            test = PerturbationTest(class_settings=settings, directions=directions)
            test.build(methods)
            declared.update(test.higher_is_better())

    seg = sorted({k.split("/")[1] for k in keys if k.startswith("segmentation/") and len(k.split("/")) == 3})
    if seg:
        test = SegmentationTest()
        test.build(seg)
        declared.update(test.higher_is_better())

    cdam = [k.split("/")[1:] for k in keys if k.startswith("cdam_analysis/")]
    if cdam:
        methods = sorted({p[1] for p in cdam if p[0] in ("sparsity", "sparsity_absmax", "nonpositive_max",
                                                         "discrimination") and len(p) >= 2})
        pairs = sorted({tuple(p[1].split("__vs__")) for p in cdam if p[0] == "pearson" and len(p) == 2})
        pairs = [p for p in pairs if len(p) == 2 and set(p) <= set(methods)]
        if methods:
            test = CDAMAnalysis(pairs=pairs)
            test.build(methods)
            declared.update(test.higher_is_better())
    rationale = [k.split("/") for k in keys if k.startswith("rationale/") and len(k.split("/")) == 4]
    if rationale:
        settings = sorted({p[2] for p in rationale} & {"predicted", "target"})
        suffixes = {p[3].rsplit("@", 1)[1] for p in rationale if "@" in p[3]}
        ks = sorted(int(k) for k in suffixes if k.isdigit())
        if settings:
            test = RationaleTest(class_settings=settings, **({"ks": ks} if ks else {}))
            test.build(sorted({p[1] for p in rationale}))
            declared.update(test.higher_is_better())

    eraser = [k.split("/") for k in keys if k.startswith("eraser/") and len(k.split("/")) == 4]
    if eraser:
        settings = sorted({p[2] for p in eraser} & {"predicted", "target"})
        bins = sorted({float(p[3].rsplit("@", 1)[1]) for p in eraser if "@" in p[3]})
        if settings:
            test = ERASERFaithfulnessTest(class_settings=settings, **({"bins": bins} if bins else {}))
            test.build(sorted({p[1] for p in eraser}))
            declared.update(test.higher_is_better())
    return {key: declared.get(key) for key in keys}
