"""Model adapters: one typed interface (:class:`ModelAdapter`); the families implement it in :mod:`methods.families`.

    from methods.adapters import adapter_for
    adapter = adapter_for(model)          # resolved once per model object
    inputs = adapter.inputs.prepare(images_or_tokenizer_batch)
    adapter.inputs.layout(inputs)         # PatchGrid(rows, cols, prefix) or TokenSequence(masks)

Importing a family's package registers it; :mod:`methods.families` imports the families shipped here (importing
:mod:`methods` does).
"""
from .base import (  # noqa: F401
    ADAPTERS,
    READOUT_KINDS,
    WEIGHTED_READOUTS,
    AttentionEdit,
    AttentionLinears,
    AttentionRecompute,
    BlockDecomposition,
    BlockLinears,
    Decoder,
    Edit,
    HeadLayers,
    ImageInputs,
    InputFormat,
    Layout,
    LogitLens,
    MethodUndefinedError,
    ModelAdapter,
    ModelInputs,
    PatchGrid,
    Projection,
    RawInputs,
    ReadOut,
    Recording,
    RuleMap,
    SampleIds,
    SequenceContext,
    TokenFlow,
    TokenSequence,
    TokenSpace,
    ValueRecorder,
    adapter_for,
    check_sample_ids,
    linear_weight,
    out_features,
    register_adapter,
)
from .library import class_problem, library_class  # noqa: F401
from .recorder import ActivationRecorder  # noqa: F401
