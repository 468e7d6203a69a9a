"""Result keys: the one way a result's name is written (``metrics.json``, the logger) and read back.

A result key names a *test*, the *method* whose map was tested, the *class setting* (``predicted``, ``target``,
...) and the *metric*; the perturbation test adds its *direction* (``positive``/``negative``). Any part but the
test and the metric may be empty. The string form joins the parts with ``/``; most tests use the **generic
layout**, which any new test gets without editing this module:

* ``<test>`` (1 part: the metric is the test, e.g. ``accuracy``);
* ``<test>/<metric>`` (e.g. ``rationale/coverage``);
* ``<test>/<method>/<metric>`` (e.g. ``segmentation/<method>/miou``);
* ``<test>/<method>/<setting>/<metric>`` (e.g. ``rationale/<method>/target/token_f1@5``,
  ``eraser/<method>/predicted/aopc_sufficiency``);
* ``<test>/<method>/<direction>/<setting>/<metric>`` (``perturbation/<method>/positive/predicted/auc|curve``).

The CDAM analysis writes the metric before the method: ``cdam_analysis/<metric>/<method>`` (``sparsity``,
``pearson`` with the method pair ``<a>__vs__<b>`` as method, ...) and ``cdam_analysis/discrimination/<method>/<x>``
(metric ``discrimination/<x>``). A metric may end in ``@<k>`` (a point of a curve: ``token_f1@10``,
``comprehensiveness@0.5``). :meth:`ResultKey.parse` inverts :meth:`ResultKey.format` exactly; a key that fits no
layout is refused with a ``ValueError`` that names it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

#: the test whose keys put the metric before the method (module docstring)
CDAM = "cdam_analysis"
DISCRIMINATION = "discrimination/"


@dataclass(frozen=True)
class ResultKey:
    """One result's name (module docstring); ``str(key)`` is :meth:`format`."""

    test: str
    method: str = ""
    setting: str = ""
    metric: str = ""
    direction: str = ""

    def __post_init__(self) -> None:
        if not self.metric:
            object.__setattr__(self, "metric", self.test)   # ResultKey("accuracy")
        metric = self.metric[len(DISCRIMINATION):] if self._discrimination else self.metric
        for name, value in (("test", self.test), ("method", self.method), ("setting", self.setting),
                            ("metric", metric), ("direction", self.direction)):
            if "/" in value or value != value.strip():
                raise ValueError(f"result key part {name}={value!r} must not hold '/' or surrounding spaces")
        if not self.test:
            raise ValueError("a result key needs a test")
        if self.test == CDAM and (not self.method or self.metric == "discrimination"):
            raise ValueError(f"{CDAM} result keys need a method (or method pair) and a metric: {self!r}")
        if self.setting and not self.method or self.direction and not self.setting:
            raise ValueError(f"a result key's setting needs a method and its direction a setting: {self!r}")
        if self.metric == self.test and (self.method or self.setting):
            raise ValueError(f"a result key with a method names its metric: {self!r}")

    @property
    def _discrimination(self) -> bool:
        return self.test == CDAM and self.metric.startswith(DISCRIMINATION)

    def format(self) -> str:
        """The key as ``metrics.json`` writes it."""
        if self.test == CDAM:
            if self._discrimination:
                return f"{CDAM}/discrimination/{self.method}/{self.metric[len(DISCRIMINATION):]}"
            return f"{CDAM}/{self.metric}/{self.method}"
        if self.metric == self.test:
            return self.test
        return "/".join(p for p in (self.test, self.method, self.direction, self.setting, self.metric) if p)

    __str__ = format

    @classmethod
    def parse(cls, key: str) -> "ResultKey":
        """The :class:`ResultKey` written as ``key`` (``ValueError`` for a key that fits no layout)."""
        parts = str(key).split("/")
        try:
            if any(not p for p in parts):
                raise ValueError("an empty part")
            if parts[0] == CDAM:
                if len(parts) == 4 and parts[1] == "discrimination":
                    parsed = cls(CDAM, parts[2], metric=DISCRIMINATION + parts[3])
                elif len(parts) == 3 and parts[1] != "discrimination":
                    parsed = cls(CDAM, parts[2], metric=parts[1])
                else:
                    raise ValueError(f"{CDAM} keys are {CDAM}/<metric>/<method> or "
                                     f"{CDAM}/discrimination/<method>/<metric>")
            elif len(parts) == 1:
                parsed = cls(parts[0])
            elif len(parts) == 2:
                parsed = cls(parts[0], metric=parts[1])
            elif len(parts) == 3:
                parsed = cls(parts[0], parts[1], metric=parts[2])
            elif len(parts) == 4:
                parsed = cls(parts[0], parts[1], parts[2], parts[3])
            elif len(parts) == 5:
                parsed = cls(parts[0], parts[1], parts[3], parts[4], direction=parts[2])
            else:
                raise ValueError("more than 5 parts")
            if parsed.format() != key:
                raise ValueError(f"it is written {parsed.format()!r}")
        except ValueError as err:
            raise ValueError(f"malformed result key {key!r}: {err} (evaluation.result_keys lists the forms)") from None
        return parsed

    @classmethod
    def try_parse(cls, key: str) -> Optional["ResultKey"]:
        """:meth:`parse`, or ``None`` for a key that fits no layout (readers of values that may be no results,
        such as a W&B summary's)."""
        try:
            return cls.parse(key)
        except ValueError:
            return None

    def with_method(self, method: str) -> "ResultKey":
        """The same result of another method (e.g. the ``random`` map's)."""
        return replace(self, method=method)

    @property
    def metric_kind(self) -> str:
        """The metric with its ``@<k>`` point written ``@`` (``token_f1@10`` -> ``token_f1@``): one name for every
        point of a curve."""
        return self.metric.split("@", 1)[0] + ("@" if "@" in self.metric else "")

    @property
    def column(self) -> str:
        """What the key says besides its test and method: ``<direction>/<setting>/<metric>`` (empty parts left out;
        the CDAM analysis: its metric)."""
        if self.test == CDAM:
            return self.metric
        return "/".join(p for p in (self.direction, self.setting, self.metric) if p)
