"""The README's metric list (callbacks/metric_catalogue.py) is generated from the callbacks' metric cards."""
from __future__ import annotations

import json

from callbacks.complexity import ComplexityTest
from callbacks.faithfulness_correlation import FaithfulnessCorrelationTest
from callbacks.localisation import LocalisationTest
from callbacks.metric_catalogue import README, catalogue_classes, markdown, prefix_of, readme_table, rows
from callbacks.robustness import RobustnessTest
from callbacks.saco import SaCoTest


def test_readme_holds_the_current_metric_catalogue():
    """``python -m callbacks.metric_catalogue --write`` after adding or changing a metric card."""
    assert readme_table(README.read_text()) == markdown()


def test_every_catalogue_callback_is_collected_once():
    classes = catalogue_classes()
    for cls in (LocalisationTest, ComplexityTest, FaithfulnessCorrelationTest):
        assert classes.count(cls) == 1
    names = [(prefix_of(cls), card.name) for cls, card in rows()]
    assert len(names) == len(set(names))            # one card per metric of a test
    assert all(f"/…/{card.name}`" in markdown() for _, card in rows())


def test_conventions_are_plain_and_name_the_options():
    for test, option, value in ((LocalisationTest(unit="patch"), "unit", "patch"),
                                (ComplexityTest(threshold=0.01), "effective_threshold", "0.01 x max|a|"),
                                (FaithfulnessCorrelationTest(runs=7), "runs", 7), (SaCoTest(groups=5), "groups", 5),
                                (RobustnessTest(radius=0.1), "radius", 0.1)):
        conventions = test.conventions()
        assert conventions[option] == value and json.loads(json.dumps(conventions)) == conventions
