"""Attribution methods on stock Transformers, behind one registry and one call shape.

    from methods import build_method, available_methods
    method = build_method("rollout", start_layer=0)
    scores = method(model, inputs, target=None)   # [B, P] patch scores for images ([B, H, W] pixels for lrp);
                                                  # [B, N] per input position for token sequences
"""
# Importing the families registers their adapters and topologies; importing the method modules registers them.
from . import (
    ablation_methods,  # noqa: F401,E402
    alti,  # noqa: F401,E402
    atman,  # noqa: F401,E402
    attcat,  # noqa: F401,E402
    attention_methods,  # noqa: F401,E402
    attnlrp,  # noqa: F401,E402
    beyond_intuition,  # noqa: F401,E402
    decompx,  # noqa: F401,E402
    families,  # noqa: F401,E402
    grad_sam,  # noqa: F401,E402
    gradient_baselines,  # noqa: F401,E402
    gradient_methods,  # noqa: F401,E402
    integrated_gradients,  # noqa: F401,E402
    legrad,  # noqa: F401,E402
    noise_tunnel,  # noqa: F401,E402
    occlusion,  # noqa: F401,E402
    random_baseline,  # noqa: F401,E402
    relevance_methods,  # noqa: F401,E402
    surrogate_baselines,  # noqa: F401,E402
    transition_attention,  # noqa: F401,E402
    value_zeroing,  # noqa: F401,E402
)
from .adapters import MethodUndefinedError  # noqa: F401
from .base import AttributionMethod  # noqa: F401
from .maps import minmax_normalize, tokens_to_map  # noqa: F401
from .registry import available_methods, build_method, method_class, register_method  # noqa: F401
