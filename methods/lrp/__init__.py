"""Relevance propagation (LRP) on stock Transformers: rules keyed by layer type, shared sub-layers, the
topology base and registry, and the engine that runs them (each family's topology lives in its folder of
:mod:`methods.families`)."""
from .engine import LRPEngine, LRPResult  # noqa: F401
from .rules import RULE_SETS, RuleSet, get_rules, safe_divide  # noqa: F401
from .topology import TOPOLOGIES, register_topology, topology_for  # noqa: F401
