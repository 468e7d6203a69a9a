"""Relevance propagation (LRP) on stock Transformers: rules keyed by layer type, per-family graph walks, engine."""
from .engine import LRPEngine, LRPResult  # noqa: F401
from .rules import RULE_SETS, RuleSet, get_rules, safe_divide  # noqa: F401
from .walks import WALKS, TimmViTWalk, walk_for  # noqa: F401
