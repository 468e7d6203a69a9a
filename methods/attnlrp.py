"""AttnLRP and CP-LRP as one forward and one backward pass (Input x Gradient with modified local gradients).

Achtibat et al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers" (ICML), in
the Gradient x Input form of Arras et al. 2025 that LXT, the authors' library, runs in its "efficient" mode
(``lxt/efficient/``). The rules come from forward hooks on the stock model's own modules, registered for one
call and removed after it: no class, function or attention implementation is patched, every forward value is
the stock model's (the logits are bit-identical), only gradients change:

* **Linear layers, additions, embeddings, average pooling**: the plain gradient, i.e. epsilon-LRP with the
  biases keeping their share (LXT efficient mode: no stabiliser on linear layers);
* **LayerNorm** (every ``nn.LayerNorm`` of the model: block norms, the final norm, BERT's embedding norm, q/k
  norms): the identity rule as LXT's ``layer_norm_forward``, ``(x - mean) / stop_grad(sqrt(var + eps)) * w + b``;
* **RMSNorm** (every module whose class name ends in ``RMSNorm``: Llama's, Mistral's, Qwen2/3's incl. Qwen3's
  q/k norms, Gemma's ``(1 + w)`` form): the identity rule as LXT's ``rms_norm_forward``, ``x *
  stop_grad(rsqrt(mean(x^2) + eps))``, the statistics in float32 and the casts of the stock module (an RMSNorm
  of another form is refused);
* **gated MLP** (the adapter's :meth:`~methods.adapters.base.RuleMap.gated_mlps`, ``down_proj(act_fn(gate_proj(x))
  * up_proj(x))``): ``attnlrp``: the identity rule on ``act_fn`` (found by type, as every activation) and the
  uniform rule on the product (the gradient of ``down_proj``'s input times 1/2, a forward pre-hook); ``cp_lrp``:
  the gate branch detached (``gate_proj``'s output), no 1/2 (LXT's ``gated_mlp_forward`` /
  ``cp_gated_mlp_forward``);
* **element-wise activations** (every activation module of torch, timm and ``transformers``: the MLP's GELU,
  BERT's pooler tanh, ELECTRA's head GELU; the functional tanh / ReLU of RoBERTa's and DistilBERT's heads through
  the adapter's :meth:`~methods.adapters.base.RuleMap.head_rules`): the identity rule (AttnLRP Eq. 9), gradient
  ``g * act(x) / (x + epsilon)`` with LXT's ``epsilon = 1e-10`` added whatever the sign of ``x``;
* **attention** (``attnlrp``): the uniform rule (AttnLRP Eq. 7) on both matrix products, ``q k^T`` and ``A v``:
  gradients at ``q`` and ``k`` times 1/4 and at ``v`` times 1/2 (LXT's wrapper of every attention function;
  applied here at the outputs of the q/k/v projections, which is the same since backward is linear in the
  incoming gradient and the rotary embedding and the repetition of grouped key/value heads are linear; GPT-2's
  fused ``Conv1D`` ``c_attn``: the factors on its ``[q | k | v]`` thirds; every ``nn.MultiheadAttention`` of the
  rule scope (open_clip's blocks, SigLIP's attention-pooling head), whose projections are a packed weight applied
  functionally inside the module: the factors on its ``query``, ``key`` and ``value`` inputs through a forward
  pre-hook, each of which feeds only its own third of ``in_proj_weight`` (the gamma rule is refused there); an
  attention pooling head, the adapter's :meth:`~methods.adapters.base.RuleMap.head_attention_linears` (timm's
  ``map`` pool): the same factors on its query projection and on the halves of its fused ``[k | v]``; an adapter
  whose model computes q, k, v without modules places them itself,
  :meth:`~methods.adapters.base.RuleMap.product_rules`: timm's EVA / BEiT); the softmax keeps its plain gradient
  (LXT's efficient mode). ``cp_lrp`` (Ali et al. 2022, "XAI for Transformers: Better Explanations through
  Conservative Propagation"): ``q`` and ``k`` detached, so the attention probabilities are constants, ``v``
  plain;
* **CLIP's score** ``logit_scale.exp() * cos(z, e_c)``: the identity rule on the L2 normalisation (the norm a
  constant, as LayerNorm's deviation): no reference exists (LXT's OpenCLIP example is explicit-mode).

Relevance is ``x * dlogit/dx`` of the explained logit (the raw logit, not a one-hot 1: LXT backpropagates the
logit itself) summed over the embedding width, at ``level``:

* ``"tokens"`` (default; LXT's convention, ``input_embeds``): ``x`` is the output of the model's input embedding
  only (text: the word embeddings, so position and token-type embeddings keep their own share, as in LXT's BERT
  and GPT-2 goldens; decoders: ``wte`` / ``embed_tokens``, Gemma 3's scaled output; images: the patch embedding,
  so [CLS], register tokens, the position embedding and the patch embedding's bias keep theirs); output
  ``[B, N]`` for text (every real token, special tokens included, exactly 0 at padding) and ``[B, P]`` patch
  scores for images;
* ``"pixels"`` (images only; LXT's ViT example, ``(input * input.grad).sum(1)``): ``x`` is the normalised image;
  output ``[B, H, W]`` summed over the channels (a pixel map, as full ``lrp``'s). The image evaluation configs
  use it: at the pixel protocols' resolution it is far more faithful than the patch scores (measured on the
  synthetic ViT, ``benchmarks/README.md``);
* ``"patches"`` (images only): the ``"pixels"`` relevance summed over each patch, ``[B, P]`` in row-major grid
  order (the pixels' share of each patch token, without the patch embedding's bias).

``explain`` / ``foil`` (:mod:`methods.explanation_targets`): the output backpropagated instead of the logit
(``"logit"`` default, LXT's; ``"probability"``, ``"log_probability"``, ``"logit_difference"`` /
``"probability_difference"`` against ``foil``); the scores are linear in the output's gradient, so a logit
difference's map is the target's map minus the foil's.

Scores are raw (not normalised, sign kept), so conservation can be read off them; :meth:`relevance_by_layer`
reports the relevance entering every block for that check (LXT#27, #32). The attention stays as the model was
built (fused / sdpa or eager): these methods never read the attention probabilities. ``epsilon``: the identity
rule's stabiliser. ``rules=False`` switches every rule off (plain gradients): the
scores are then Input x Gradient at ``level`` (equal to ``input_x_gradient``, asserted by the tests). Padding needs
nothing of its own: a padded key's probability is exactly 0, so no gradient
reaches it. ``gamma`` / ``conv_gamma`` (default ``None``: off, LXT's efficient default) put the gamma rule
on every ``nn.Linear`` (and GPT-2's ``Conv1D``) / ``nn.Conv2d`` of the model (weights and biases ``p + gamma *
p.clamp(min=0)``, zennit's ``Gamma`` with stabiliser 1e-6, divided by the input stabilised by 1e-10, as LXT's
patch of zennit), what LXT's ViT example tunes (its linear gamma 0-1, conv gamma 0.1-100; ``conv_gamma`` acts
at ``level="pixels"`` and ``"patches"``). Where the paper's softmax rule (Eq. 13, with its bias term) differs
from LXT's efficient mode, the code is followed (see ``../shared/golden/README-attnlrp.md``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from .adapters import (
    ActivationRecorder,
    AttentionLinears,
    MethodUndefinedError,
    ModelAdapter,
    ModelInputs,
    PatchGrid,
    adapter_for,
    out_features,
)
from .adapters.gradient_rules import (
    IDENTITY_EPSILON,
    gamma_rule,
    identity_rule,
    input_gradient_scaled,
    layer_norm_rule,
    output_gradient_scaled,
    rms_norm_rule,
    scale_gradient,
)
from .explained_output import ExplainedOutput
from .explanation_targets import explained_score, explained_scores
from .model_state import preserved_model_state
from .registry import register_method
from .targets import TargetType

LEVELS = ("tokens", "pixels", "patches")
#: the levels that read the image itself
IMAGE_LEVELS = ("pixels", "patches")
#: gradient factors on (query, key, value) per variant: the uniform rule on two products, or constant attention
ATTENTION_FACTORS = {"attnlrp": (0.25, 0.25, 0.5), "cp_lrp": (0.0, 0.0, 1.0)}
#: modules of these packages are element-wise activations, except the classes named in _NOT_ELEMENTWISE
_ACTIVATION_MODULES = ("torch.nn.modules.activation", "transformers.activations", "timm.layers.activations")
_NOT_ELEMENTWISE = {"Softmax", "Softmin", "LogSoftmax", "Softmax2d", "MultiheadAttention", "GLU", "ClassInstantier"}
#: element-wise activations defined beside other layers: (module, class name)
_ACTIVATION_CLASSES = {("open_clip.transformer", "QuickGELU")}


def is_elementwise_activation(module: nn.Module) -> bool:
    """Whether ``module`` is an element-wise activation module of torch, timm or ``transformers`` (or open_clip's
    ``QuickGELU``)."""
    cls = type(module)
    return ((cls.__module__ in _ACTIVATION_MODULES and cls.__name__ not in _NOT_ELEMENTWISE)
            or (cls.__module__, cls.__name__) in _ACTIVATION_CLASSES)


def _activation_hook(epsilon: float):
    def hook(_module: nn.Module, inputs: Tuple[Any, ...], output: Tensor) -> Tensor:
        return identity_rule(inputs[0], output, epsilon)
    return hook


def _layer_norm_hook(module: nn.LayerNorm, inputs: Tuple[Any, ...], output: Tensor) -> Tensor:
    return layer_norm_rule(inputs[0], output, module.weight, module.eps)


def is_rms_norm(module: nn.Module) -> bool:
    """Whether ``module`` is an RMSNorm (a class whose name ends in ``RMSNorm``: Llama's, Qwen's, Gemma's, ...)."""
    return type(module).__name__.endswith("RMSNorm")


def rms_norm_form(module: nn.Module) -> Optional[Tuple[float, bool]]:
    """``(eps, offset)`` of an RMSNorm module of a known form: ``variance_epsilon`` and ``w * norm(x)`` (Llama,
    Mistral, Qwen2/3: ``offset`` False), or a Gemma class with ``eps`` and ``(1 + w) * norm(x)`` (``offset``
    True); ``None`` otherwise."""
    variance_epsilon, eps = getattr(module, "variance_epsilon", None), getattr(module, "eps", None)
    if isinstance(variance_epsilon, float):
        return variance_epsilon, False
    if type(module).__name__.startswith("Gemma") and isinstance(eps, float):
        return eps, True
    return None


def _rms_norm_hook(eps: float, offset: bool):
    def hook(module: nn.Module, inputs: Tuple[Any, ...], output: Tensor) -> Tensor:
        return rms_norm_rule(inputs[0], output, getattr(module, "weight", None), eps, offset)
    return hook


def _detach_output(_module: nn.Module, _inputs: Tuple[Any, ...], output: Tensor) -> Tensor:
    return output.detach()


def rule_scope_problems(adapter: ModelAdapter) -> List[str]:
    """What in the adapter's rule scope the rules here cannot handle: RMSNorms of an unknown form, gated MLPs
    whose activation is not an element-wise activation module."""
    problems = [f"{name or 'model'}: {type(module).__name__} of unknown form"
                for name, module in adapter.rule_map.scope().named_modules()
                if is_rms_norm(module) and rms_norm_form(module) is None]
    for i, mlp in enumerate(adapter.rule_map.gated_mlps()):
        if not is_elementwise_activation(getattr(mlp, "act_fn", None) or nn.Identity()):
            problems.append(f"gated mlp {i}: activation {type(getattr(mlp, 'act_fn', None)).__name__} is not an "
                            "element-wise activation module")
    return problems


def _gamma_parameter(p: Any, gamma: float) -> Any:
    return None if p is None else p + gamma * p.clamp(min=0)


def _gamma_hook(gamma: float):
    """The gamma rule on an ``nn.Linear`` or ``nn.Conv2d`` (weight and bias modified, as zennit's ``Gamma``)."""
    def hook(module: nn.Module, inputs: Tuple[Any, ...], output: Tensor) -> Tensor:
        def modified(x: Tensor) -> Tensor:
            weight, bias = _gamma_parameter(module.weight, gamma), _gamma_parameter(module.bias, gamma)
            if isinstance(module, nn.Conv2d):
                return F.conv2d(x, weight, bias, module.stride, module.padding, module.dilation, module.groups)
            if isinstance(module, Conv1D):   # GPT-2's linear layers: weight stored [in, out]
                return F.linear(x, weight.t(), bias)
            return F.linear(x, weight, bias)
        return gamma_rule(inputs[0], output, modified)
    return hook


def _attention_inputs_hook(factors: Tuple[float, float, float]):
    """Forward pre-hook of an ``nn.MultiheadAttention``: its ``query``, ``key`` and ``value`` (positional or
    keyword) with their gradients times ``factors`` (0: detached). The module then projects three tensors rather
    than one it is handed three times; its values are the same."""
    names = ("query", "key", "value")

    def hook(_module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
        positional, kwargs = list(args), dict(kwargs)
        for i, (name, factor) in enumerate(zip(names, factors)):
            if i < len(positional):
                positional[i] = scale_gradient(positional[i], factor)
            elif kwargs.get(name) is not None:
                kwargs[name] = scale_gradient(kwargs[name], factor)
        return tuple(positional), kwargs
    return hook


def _module_rule_hook(module: nn.Module, variant: str, epsilon: float, gamma: Optional[float],
                      conv_gamma: Optional[float], factors: Tuple[float, float, float]) -> Optional[Any]:
    """The hook of ``module``'s rule by its type (gamma on linear and convolution layers when asked for, the
    LayerNorm / RMSNorm / activation rules, the attention factors at an ``nn.MultiheadAttention``'s inputs), or
    ``None`` when it has none."""
    if isinstance(module, (nn.Linear, Conv1D)) and gamma is not None:
        return module.register_forward_hook(_gamma_hook(gamma))
    if isinstance(module, nn.Conv2d) and conv_gamma is not None:
        return module.register_forward_hook(_gamma_hook(conv_gamma))
    if isinstance(module, nn.LayerNorm):
        if len(module.normalized_shape) != 1:
            raise TypeError(f"{variant}: LayerNorm over {tuple(module.normalized_shape)} (the rule "
                            "normalises the last dimension only)")
        return module.register_forward_hook(_layer_norm_hook)
    if is_rms_norm(module):
        form = rms_norm_form(module)
        if form is None:
            raise TypeError(f"{variant}: {type(module).__name__} of unknown form")
        return module.register_forward_hook(_rms_norm_hook(*form))
    if is_elementwise_activation(module):
        return module.register_forward_hook(_activation_hook(epsilon))
    if isinstance(module, nn.MultiheadAttention):
        return module.register_forward_pre_hook(_attention_inputs_hook(factors), with_kwargs=True)
    return None


def _attention_factor_hooks(linears: AttentionLinears, factors: Tuple[float, float, float]) -> List[Any]:
    """The gradient factors ``(q, k, v)`` at the outputs of one attention sub-layer's projections (fused
    ``qkv``, an attention pool's own ``q`` and fused ``[k | v]``, or separate ``q``, ``k``, ``v``)."""
    q_factor, k_factor, v_factor = factors
    if linears.multihead is not None:    # its factors: the rule scope's nn.MultiheadAttention hook
        return []
    if linears.qkv is not None:
        third = out_features(linears.qkv) // 3
        qkv = torch.tensor([q_factor] * third + [k_factor] * third + [v_factor] * third)
        return [linears.qkv.register_forward_hook(output_gradient_scaled(qkv))]
    if linears.kv is not None:   # an attention pooling head: its own query, a fused [k | v]
        half = out_features(linears.kv) // 2
        kv = torch.tensor([k_factor] * half + [v_factor] * half)
        handles = [linears.kv.register_forward_hook(output_gradient_scaled(kv))]
        if linears.q is not None and q_factor != 1.0:
            handles.append(linears.q.register_forward_hook(output_gradient_scaled(q_factor)))
        return handles
    return [linear.register_forward_hook(output_gradient_scaled(factor))
            for linear, factor in ((linears.q, q_factor), (linears.k, k_factor), (linears.v, v_factor))
            if linear is not None and factor != 1.0]


@contextlib.contextmanager
def relevance_rules(adapter: ModelAdapter, variant: str, epsilon: float = IDENTITY_EPSILON,
                    gamma: Optional[float] = None, conv_gamma: Optional[float] = None) -> Iterator[None]:
    """The rules of ``variant`` (``"attnlrp"`` or ``"cp_lrp"``) on ``adapter``'s model for the duration of the
    block: forward hooks on its norms, activations, attention projections and (with ``gamma`` / ``conv_gamma``)
    linear and convolution layers, and the rule map's :meth:`~methods.adapters.base.RuleMap.head_rules`; all
    removed on exit."""
    factors = ATTENTION_FACTORS[variant]
    rule_map = adapter.rule_map
    handles = []
    if gamma is not None and any(isinstance(m, nn.MultiheadAttention) for m in rule_map.scope().modules()):
        raise MethodUndefinedError(f"{variant}: the gamma rule needs hooks on every linear layer; "
                                   "nn.MultiheadAttention applies in_proj_weight and out_proj functionally")
    own_products = rule_map.product_rules(factors, "constant" if variant == "cp_lrp" else "uniform", gamma)
    try:
        for module in rule_map.scope().modules():
            handle = _module_rule_hook(module, variant, epsilon, gamma, conv_gamma, factors)
            if handle is not None:
                handles.append(handle)
        mlp: Any
        for mlp in rule_map.gated_mlps() if own_products is None else ():
            if variant == "cp_lrp":
                handles.append(mlp.gate_proj.register_forward_hook(_detach_output))
            else:
                handles.append(mlp.down_proj.register_forward_pre_hook(input_gradient_scaled(0.5)))  # uniform rule
        hooked = range(len(adapter.blocks) if own_products is None else 0)
        attentions = [adapter.linears(layer).attention for layer in hooked]
        for linears in attentions + rule_map.head_attention_linears():
            handles.extend(_attention_factor_hooks(linears, factors))
        with own_products or contextlib.nullcontext(), rule_map.head_rules(epsilon):
            yield
    finally:
        for handle in handles:
            handle.remove()


class _GradientLRP(ExplainedOutput):
    """Shared by :class:`AttnLRP` and :class:`CPLRP` (see the module docstring)."""

    variant = "?"
    reads_attention = False

    def __init__(self, level: str = "tokens", epsilon: float = IDENTITY_EPSILON, gamma: Optional[float] = None,
                 conv_gamma: Optional[float] = None, rules: bool = True, explain: str = "logit",
                 foil: Optional[int] = None):
        super().__init__(explain, foil)
        if level not in LEVELS:
            raise ValueError(f"{self.name}: level must be one of {LEVELS}, got {level!r}")
        for option, value in (("epsilon", epsilon), ("gamma", gamma), ("conv_gamma", conv_gamma)):
            if value is not None and not value >= 0:
                raise ValueError(f"{self.name}: {option} must be >= 0, got {value!r}")
        self.level = level
        self.epsilon = float(epsilon)
        self.gamma = gamma
        self.conv_gamma = conv_gamma
        self.rules = bool(rules)

    def check_adapter(self, adapter: ModelAdapter) -> None:
        super().check_adapter(adapter)
        if self.level in IMAGE_LEVELS and adapter.inputs.layout_class.modality != "image":
            raise ValueError(f"{self.name}: level={self.level!r} needs an image model; {type(adapter.model).__name__} "
                             f"({adapter.family}) reads {adapter.inputs.layout_class.modality}")
        problems = adapter.rule_map.problems() + rule_scope_problems(adapter) if self.rules else []
        if problems:
            raise MethodUndefinedError(f"{self.name}: no relevance rule for parts of this "
                                       f"{type(adapter.model).__name__} ({adapter.family}): {'; '.join(problems[:6])}")

    def _backward(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType,
                  layer_inputs: bool = False) -> Dict[str, Any]:
        """One forward under the rules, one ``autograd.grad`` of the explained outputs: the input ``x`` and its
        gradient, the logits, the resolved target and foil and (``layer_inputs``) every block input with its
        gradient."""
        for p in adapter.model.parameters():   # restored by preserved_model_state; no weight gradients
            p.requires_grad_(False)
        pixels = self.level in IMAGE_LEVELS
        if pixels:
            inputs = inputs.with_tensors(pixel_values=inputs["pixel_values"].detach().requires_grad_(True))
        rules = (relevance_rules(adapter, self.variant, self.epsilon, self.gamma, self.conv_gamma) if self.rules
                 else contextlib.nullcontext())
        with ActivationRecorder() as rec, rules, torch.enable_grad():
            if not pixels:
                rec.output(adapter.rule_map.input_embedding(), "x", require_grad=True)
            if layer_inputs:
                for l in range(len(adapter.blocks)):
                    adapter.recording.block_input(rec, l, ("block", l))
            context = adapter.inputs.context(inputs)
            logits = adapter.head(adapter.run_blocks(adapter.embed(inputs), context), context)
            x = inputs["pixel_values"] if pixels else rec["x"]
            blocks: List[Tensor] = [rec[("block", l)] for l in range(len(adapter.blocks))] if layer_inputs else []
        target, foil = self.resolve(logits, target)
        grads = torch.autograd.grad(explained_score(logits, target, self.explain, foil), [x] + blocks)
        return dict(x=x.detach(), grad=grads[0], logits=logits.detach(), target=target, foil=foil,
                    blocks=[(b.detach(), g) for b, g in zip(blocks, grads[1:])])

    def _scores(self, adapter: ModelAdapter, inputs: ModelInputs, x: Tensor, grad: Tensor) -> Tensor:
        products = x * grad
        if self.level == "tokens":
            return adapter.rule_map.embedding_scores(products)
        pixels = products.sum(dim=1)
        if self.level == "pixels":
            return pixels
        layout = adapter.inputs.layout(inputs)
        assert isinstance(layout, PatchGrid)   # an image model (check_adapter)
        rows, cols = layout.grid                # images are a whole number of patches (inputs.prepare)
        batch, height, width = pixels.shape
        return pixels.reshape(batch, rows, height // rows, cols, width // cols).sum(dim=(2, 4)).flatten(1)

    def attribute(self, adapter: ModelAdapter, inputs: ModelInputs, target: TargetType) -> Tensor:
        out = self._backward(adapter, inputs, target)
        return self._scores(adapter, inputs, out["x"], out["grad"])

    def relevance_by_layer(self, model: nn.Module, inputs: Any, target: TargetType = None) -> Dict[str, Tensor]:
        """The conservation report of one call, per sample: ``logit`` ``[B]`` (the explained output: the target
        logit by default), ``blocks``
        ``[depth, B]`` (the relevance entering each block: ``sum(h_l * dlogit/dh_l)`` over positions and width),
        ``input`` ``[B]`` (the sum of this method's scores, padding 0) and ``scores`` (the scores themselves).
        Where every rule conserves (``cp_lrp`` on a bias-free model) each entry equals ``logit``."""
        adapter = self.prepare(model)
        batch = adapter.inputs.prepare(inputs)
        with preserved_model_state(model):
            out = self._backward(adapter, batch, target, layer_inputs=True)
        scores = self._scores(adapter, batch, out["x"], out["grad"])
        layout = adapter.inputs.layout(batch)
        if layout.has_padding and scores.dim() == 2:
            scores = layout.output(scores)
        blocks = torch.stack([(h * g).flatten(1).sum(dim=1) for h, g in out["blocks"]])
        logit = explained_scores(out["logits"], out["target"], self.explain, out["foil"])
        return dict(logit=logit, blocks=blocks, input=scores.flatten(1).sum(dim=1), scores=scores)

    def prepare(self, model: nn.Module) -> ModelAdapter:
        """``model``'s adapter, with this method's options checked against it."""
        adapter = adapter_for(model)
        self.check_adapter(adapter)
        return adapter


@register_method("attnlrp")
class AttnLRP(_GradientLRP):
    """AttnLRP (Achtibat et al. 2024): LayerNorm and element-wise activations by the identity rule (Eq. 9), the
    uniform rule (Eq. 7) on ``q k^T`` and ``A v``, the softmax by its gradient, linear layers by epsilon-LRP
    (plain gradient), as LXT's efficient mode. Options: ``level`` (``"tokens"``, ``"pixels"``, ``"patches"``),
    ``epsilon``
    (1e-10). See :mod:`methods.attnlrp` for every convention."""

    variant = "attnlrp"


@register_method("cp_lrp")
class CPLRP(_GradientLRP):
    """CP-LRP (Ali et al. 2022; LXT's ``cp_LRP`` maps): AttnLRP's rules outside attention, the attention
    probabilities constant (gradient stopped at ``q`` and ``k``), ``v`` by its gradient. Exactly conservative
    on a bias-free model. Options and conventions as :class:`AttnLRP` (:mod:`methods.attnlrp`)."""

    variant = "cp_lrp"
