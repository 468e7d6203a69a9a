"""Model adapters: one typed interface (:class:`ModelAdapter`), one file per model family.

    from methods.adapters import adapter_for
    adapter = adapter_for(model)          # resolved once per model object
    inputs = adapter.prepare_inputs(images_or_tokenizer_batch)
    adapter.layout(inputs)                # PatchGrid(rows, cols, prefix) or TokenSequence(masks)

Importing a family's module registers it; the families shipped here are imported below.
"""
from .base import (  # noqa: F401
    ADAPTERS,
    READOUT_KINDS,
    WEIGHTED_READOUTS,
    AttentionLinears,
    Layout,
    MethodUndefinedError,
    ModelAdapter,
    ModelInputs,
    PatchGrid,
    Projection,
    RawInputs,
    SampleIds,
    SequenceContext,
    TokenSequence,
    adapter_for,
    check_sample_ids,
    linear_weight,
    out_features,
    register_adapter,
)
from .hf_clip import HFCLIPTextAdapter, HFCLIPVisionAdapter  # noqa: F401
from .hf_decoder import (  # noqa: F401
    HFGemma3Adapter,
    HFGPT2Adapter,
    HFLlamaAdapter,
    HFMistralAdapter,
    HFQwen2Adapter,
    HFQwen3Adapter,
)
from .hf_siglip import HFSiglipTextAdapter, HFSiglipVisionAdapter  # noqa: F401
from .hf_text import HFBertAdapter, HFDistilBertAdapter, HFElectraAdapter, HFRobertaAdapter, HFTextAdapter  # noqa: F401
from .hf_vit import (  # noqa: F401
    HFDeiTAdapter,
    HFDeiTWithTeacherAdapter,
    HFDinov2Adapter,
    HFDinov2WithRegistersAdapter,
    HFViTAdapter,
    HFViTLikeAdapter,
)
from .open_clip import OpenCLIPTextAdapter, OpenCLIPVisionAdapter  # noqa: F401
from .recorder import ActivationRecorder  # noqa: F401
from .timm_beit import TimmBeitAdapter  # noqa: F401
from .timm_deit import TimmDeiTAdapter  # noqa: F401
from .timm_eva import TimmEvaAdapter  # noqa: F401
from .timm_vit import TimmViTAdapter  # noqa: F401
