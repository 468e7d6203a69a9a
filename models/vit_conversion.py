"""The same weights in the other library: a timm ViT as a ``transformers`` ViT, a timm distilled DeiT as a
``transformers`` DeiT with teacher.

    config, state = timm_to_hf_vit(timm_model)        # ViTConfig / DeiTConfig and a state dict
    hf_model = hf_vit_from_timm(timm_model)           # the built model (eval mode), weights loaded strictly

What is mapped:

* **patch embedding**: the Conv2d ``patch_embed.proj`` -> ``patch_embeddings.projection`` (same layout);
* **prefix tokens and positions**: ``cls_token`` -> ``cls_token``, ``dist_token`` -> ``distillation_token``,
  ``pos_embed`` (over the prefix tokens and the patches, the layout both libraries use) ->
  ``position_embeddings``;
* **blocks**: ``norm1`` / ``norm2`` -> the norms before attention and MLP; the fused ``attn.qkv`` (output
  ``[q | k | v]``, each ``D`` wide, heads contiguous within each) split into ``q_proj``, ``k_proj``, ``v_proj``;
  ``attn.proj`` -> ``o_proj``; ``mlp.fc1`` / ``mlp.fc2`` -> the MLP's Linear layers;
* **final norm and head**: ``norm`` -> ``layernorm``; ``head`` -> ``classifier`` (ViT) or ``cls_classifier``,
  and ``head_dist`` -> ``distillation_classifier`` (DeiT, whose logits are the mean of the two in both
  libraries);
* **config**: width, depth, heads, MLP width, image and patch size, channels, ``qkv_bias``, ``hidden_act="gelu"``
  (timm's exact ``nn.GELU``), ``layer_norm_eps`` from timm's norms (1e-6 in timm's ViTs; transformers' default
  is 1e-12, so it must be carried over), dropouts 0, ``num_labels`` = timm's ``num_classes``.

The target modules are found through the adapters' accessors (:mod:`methods.families.hf_vit`), so the state dict
carries the installed transformers' parameter names. A timm model with parts that have no counterpart in the
transformers class (registers, layer scale, q/k norm, ``fc_norm``, ``norm_pre``, average pooling, no class
token, a non-GELU MLP, ``no_embed_class``) is refused with a ``ValueError`` that names them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import Tensor, nn

from methods.adapters import adapter_for


def _is_distilled(model: nn.Module) -> bool:
    from timm.models.deit import VisionTransformerDistilled

    return isinstance(model, VisionTransformerDistilled)


def _problems(model: Any) -> List[str]:
    """What of the timm ``model`` a transformers ViT / DeiT cannot hold."""
    from timm.layers import Mlp
    from timm.models.vision_transformer import Attention, Block, VisionTransformer

    if not isinstance(model, VisionTransformer):
        return [f"{type(model).__name__} is not a timm VisionTransformer"]
    problems = []
    if model.global_pool != "token" or model.cls_token is None:
        problems.append(f"global_pool={model.global_pool!r} (need 'token' with a class token)")
    if getattr(model, "reg_token", None) is not None:
        problems.append("register tokens")
    if getattr(model, "no_embed_class", False):
        problems.append("no_embed_class (positional embedding without the prefix tokens)")
    if getattr(model, "pos_embed", None) is None:
        problems.append("no positional embedding")
    if getattr(model, "dynamic_img_size", False):
        problems.append("dynamic_img_size")
    if getattr(model, "attn_pool", None) is not None:
        problems.append("attention pooling")
    for name in ("norm_pre", "fc_norm"):
        if not isinstance(getattr(model, name, nn.Identity()), nn.Identity):
            problems.append(name)
    if not isinstance(getattr(model.patch_embed, "norm", nn.Identity()), nn.Identity):
        problems.append("patch_embed.norm")
    if not isinstance(model.norm, nn.LayerNorm):
        problems.append(f"final norm {type(model.norm).__name__} (need LayerNorm)")
    heads = [model.head] + ([model.head_dist] if _is_distilled(model) else [])
    if not all(isinstance(h, nn.Linear) for h in heads):
        problems.append("a head that is not nn.Linear (num_classes=0?)")
    for i, blk in enumerate(model.blocks):
        if type(blk) is not Block or type(blk.attn) is not Attention or type(blk.mlp) is not Mlp:
            problems.append(f"block {i}: {type(blk).__name__} / {type(blk.attn).__name__} / {type(blk.mlp).__name__} "
                            "(need timm Block / Attention / Mlp)")
            continue
        for attr in ("ls1", "ls2"):
            if not isinstance(getattr(blk, attr), nn.Identity):
                problems.append(f"block {i} layer scale {attr}")
        for attr in ("q_norm", "k_norm", "norm"):
            if not isinstance(getattr(blk.attn, attr, nn.Identity()), nn.Identity):
                problems.append(f"block {i} attn.{attr}")
        if not isinstance(blk.mlp.norm, nn.Identity):
            problems.append(f"block {i} mlp.norm")
        act = blk.mlp.act
        if not (isinstance(act, nn.GELU) and act.approximate == "none"):
            problems.append(f"block {i} activation {act} (need exact nn.GELU)")
        if not (isinstance(blk.norm1, nn.LayerNorm) and isinstance(blk.norm2, nn.LayerNorm)):
            problems.append(f"block {i} norms are not LayerNorm")
    eps = {float(n.eps) for n in model.modules() if isinstance(n, nn.LayerNorm)}
    if len(eps) > 1:
        problems.append(f"LayerNorms with different eps {sorted(eps)}")
    return problems


def timm_to_hf_config(model: Any) -> Any:
    """The ``transformers.ViTConfig`` (timm ViT) or ``DeiTConfig`` (timm distilled DeiT) of ``model``."""
    import transformers

    problems = _problems(model)
    if problems:
        raise ValueError(f"cannot convert this timm {type(model).__name__} to transformers: {'; '.join(problems)}")
    blk = model.blocks[0]
    (ih, iw), (ph, pw) = model.patch_embed.img_size, model.patch_embed.patch_size
    if ih != iw or ph != pw:
        raise ValueError(f"cannot convert this timm {type(model).__name__} to transformers: non-square image "
                         f"{ih}x{iw} or patch {ph}x{pw}")
    config_class = transformers.DeiTConfig if _is_distilled(model) else transformers.ViTConfig
    return config_class(
        hidden_size=int(model.embed_dim), num_hidden_layers=len(model.blocks),
        num_attention_heads=int(blk.attn.num_heads), intermediate_size=int(blk.mlp.fc1.out_features),
        hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        layer_norm_eps=float(model.norm.eps), image_size=int(ih), patch_size=int(ph),
        num_channels=int(model.patch_embed.proj.in_channels), qkv_bias=blk.attn.qkv.bias is not None,
        num_labels=int(model.num_classes),
    )


def _model_class(model: Any) -> str:
    return "DeiTForImageClassificationWithTeacher" if _is_distilled(model) else "ViTForImageClassification"


def _copy(target: nn.Module, source: nn.Module) -> None:
    target.weight.copy_(source.weight)
    if getattr(source, "bias", None) is not None:
        target.bias.copy_(source.bias)


@torch.no_grad()
def hf_vit_from_timm(model: Any) -> nn.Module:
    """A ``transformers`` model with ``model``'s weights (module docstring), in eval mode, in ``model``'s dtype
    and device: ``ViTForImageClassification`` for a timm ViT, ``DeiTForImageClassificationWithTeacher`` for a
    timm ``VisionTransformerDistilled``."""
    import transformers

    config = timm_to_hf_config(model)
    reference = next(model.parameters())
    hf = getattr(transformers, _model_class(model))(config).to(dtype=reference.dtype, device=reference.device)
    adapter: Any = adapter_for(hf)  # the transformers ViT family (ViT, or DeiT with teacher)
    embeddings = adapter.backbone.embeddings
    _copy(embeddings.patch_embeddings.projection, model.patch_embed.proj)
    embeddings.cls_token.copy_(model.cls_token)
    if _is_distilled(model):
        embeddings.distillation_token.copy_(model.dist_token)
    embeddings.position_embeddings.copy_(model.pos_embed)
    dim = int(model.embed_dim)
    for i, blk in enumerate(model.blocks):
        layer = adapter.blocks[i]
        _copy(adapter.attention_norm(i), blk.norm1)
        _copy(layer.layernorm_after, blk.norm2)
        linears = adapter.linears(i).attention
        for j, target in enumerate((linears.q, linears.k, linears.v)):
            target.weight.copy_(blk.attn.qkv.weight[j * dim:(j + 1) * dim])
            if blk.attn.qkv.bias is not None:
                target.bias.copy_(blk.attn.qkv.bias[j * dim:(j + 1) * dim])
        _copy(linears.out, blk.attn.proj)
        fc1, fc2 = adapter.linears(i).mlp
        _copy(fc1, blk.mlp.fc1)
        _copy(fc2, blk.mlp.fc2)
    _copy(adapter.backbone.layernorm, model.norm)
    heads = adapter.classifiers()
    _copy(heads[0], model.head)
    if _is_distilled(model):
        _copy(heads[1], model.head_dist)
    return hf.eval()


def timm_to_hf_vit(model: Any) -> Tuple[Any, Dict[str, Tensor]]:
    """``(config, state_dict)`` of the ``transformers`` model that holds ``model``'s weights
    (:func:`hf_vit_from_timm`); ``type(model)`` of the result is ``getattr(transformers,
    config.architectures[0])``."""
    hf = hf_vit_from_timm(model)
    hf.config.architectures = [type(hf).__name__]
    return hf.config, {k: v.detach().clone() for k, v in hf.state_dict().items()}
