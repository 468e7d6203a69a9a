"""The README's metric list (callbacks/metric_catalogue.py) is generated from the callbacks' metric cards."""
from __future__ import annotations

from callbacks.complexity import ComplexityTest
from callbacks.faithfulness_correlation import FaithfulnessCorrelationTest
from callbacks.localisation import LocalisationTest
from callbacks.metric_catalogue import README, catalogue_classes, markdown, readme_table, rows


def test_readme_holds_the_current_metric_catalogue():
    """``python -m callbacks.metric_catalogue --write`` after adding or changing a metric card."""
    assert readme_table(README.read_text()) == markdown()


def test_every_catalogue_callback_is_collected_once():
    classes = catalogue_classes()
    for cls in (LocalisationTest, ComplexityTest, FaithfulnessCorrelationTest):
        assert classes.count(cls) == 1
    names = [(getattr(cls, "PREFIX", cls.__qualname__), card.name) for cls, card in rows()]
    assert len(names) == len(set(names))            # one card per metric of a test
    assert all(f"/…/{card.name}`" in markdown() for _, card in rows())
