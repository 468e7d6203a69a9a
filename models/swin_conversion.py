"""The same weights in the other library: a timm ``SwinTransformer`` (V1) as a ``transformers``
``SwinForImageClassification``.

    hf_model = hf_swin_from_timm(timm_model)        # the built model (eval mode), in timm_model's dtype and device

What is mapped (the module pairs are found through the Swin adapters, :mod:`methods.families.swin`):

* **patch embedding**: ``patch_embed.proj`` / ``patch_embed.norm`` -> ``embeddings.patch_embeddings.projection`` /
  ``embeddings.norm``;
* **patch merges**: ``layers[s].downsample`` (entering stage ``s > 0``) -> ``encoder.layers[s-1].downsample``
  (ending the stage before; both concatenate the 2x2 neighbours in the order (0,0), (1,0), (0,1), (1,1));
* **blocks**: ``norm1`` / ``norm2`` -> ``layernorm_before`` / ``layernorm_after``; the fused ``attn.qkv`` split into
  ``q_proj``, ``k_proj``, ``v_proj``; ``attn.proj`` -> ``o_proj``; ``relative_position_bias_table`` (the same
  relative index in both); ``mlp.fc1`` / ``mlp.fc2``;
* **final norm and head**: ``norm`` -> ``swin.layernorm``; ``head.fc`` -> ``classifier``;
* **config**: image and patch size, channels, ``embed_dim``, ``depths``, ``num_heads``, ``window_size``,
  ``mlp_ratio``, ``qkv_bias``, ``hidden_act="gelu"``, ``layer_norm_eps``, no absolute positions, dropouts 0.

A timm model the transformers class cannot hold (a non-square or per-stage window, an MLP that is not
``Linear -> exact GELU -> Linear``, norms that are not ``LayerNorm`` of one ``eps``, a head that is not ``Linear``)
is refused with a ``ValueError`` naming the parts.
"""
from __future__ import annotations

from typing import Any, List

import torch
from torch import nn

from methods.adapters import adapter_for


def _problems(model: Any) -> List[str]:
    """What of the timm ``model`` a transformers ``SwinForImageClassification`` cannot hold."""
    from timm.layers import Mlp
    from timm.models.swin_transformer import SwinTransformer

    if not isinstance(model, SwinTransformer):
        return [f"{type(model).__name__} is not a timm SwinTransformer"]
    problems = []
    windows = {tuple(blk.window_size) for layer in model.layers for blk in layer.blocks}
    if len(windows) != 1 or len(next(iter(windows))) != 2 or len(set(next(iter(windows)))) != 1:
        problems.append(f"window sizes {sorted(windows)} (need one square window for every block)")
    for s, layer in enumerate(model.layers):
        for i, blk in enumerate(layer.blocks):
            act = getattr(blk.mlp, "act", None)
            if type(blk.mlp) is not Mlp or not (isinstance(act, nn.GELU) and act.approximate == "none"):
                problems.append(f"stage {s} block {i}: MLP {type(blk.mlp).__name__} (need Linear, exact GELU, Linear)")
    if not isinstance(getattr(model.head, "fc", None), nn.Linear):
        problems.append("a head that is not nn.Linear (num_classes=0?)")
    norms = [n for n in model.modules() if isinstance(n, nn.LayerNorm)]
    if len({float(n.eps) for n in norms}) > 1:
        problems.append("LayerNorms with different eps")
    if isinstance(getattr(model.patch_embed, "norm", nn.Identity()), nn.Identity):
        problems.append("no patch_embed.norm (transformers' Swin always norms its patch embedding)")
    return problems


def timm_to_hf_swin_config(model: Any) -> Any:
    """The ``transformers.SwinConfig`` of the timm ``model``."""
    import transformers

    problems = _problems(model)
    if problems:
        raise ValueError(f"cannot convert this timm {type(model).__name__} to transformers: {'; '.join(problems)}")
    blk = model.layers[0].blocks[0]
    (ih, iw), (ph, pw) = model.patch_embed.img_size, model.patch_embed.patch_size
    if ih != iw or ph != pw:
        raise ValueError(f"cannot convert this timm {type(model).__name__} to transformers: non-square image "
                         f"{ih}x{iw} or patch {ph}x{pw}")
    return transformers.SwinConfig(
        image_size=int(ih), patch_size=int(ph), num_channels=int(model.patch_embed.proj.in_channels),
        embed_dim=int(model.embed_dim), depths=[len(layer.blocks) for layer in model.layers],
        num_heads=[int(layer.blocks[0].attn.num_heads) for layer in model.layers],
        window_size=int(model.layers[0].blocks[0].window_size[0]),
        mlp_ratio=blk.mlp.fc1.out_features / blk.mlp.fc1.in_features, qkv_bias=blk.attn.qkv.bias is not None,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0, hidden_act="gelu",
        use_absolute_embeddings=False, patch_norm=True, layer_norm_eps=float(model.norm.eps),
        num_labels=int(model.num_classes),
    )


def _copy(target: nn.Module, source: nn.Module) -> None:
    target.weight.copy_(source.weight)
    if getattr(source, "bias", None) is not None:
        target.bias.copy_(source.bias)


@torch.no_grad()
def hf_swin_from_timm(model: Any) -> nn.Module:
    """A ``transformers`` ``SwinForImageClassification`` with ``model``'s weights (module docstring), in eval mode,
    in ``model``'s dtype and device."""
    import transformers

    config = timm_to_hf_swin_config(model)
    reference = next(model.parameters())
    hf = transformers.SwinForImageClassification(config).to(dtype=reference.dtype, device=reference.device)
    source: Any = adapter_for(model)
    target: Any = adapter_for(hf)
    embeddings = hf.swin.embeddings
    _copy(target.patch_projection(), source.patch_projection())
    _copy(embeddings.norm, model.patch_embed.norm)
    for (_, merge_from), (_, merge_to) in zip(source.stages, target.stages):
        if merge_from is not None:
            _copy(merge_to.norm, merge_from.norm)
            _copy(merge_to.reduction, merge_from.reduction)
    for i, blk in enumerate(source.blocks):
        layer = target.blocks[i]
        _copy(target.attention_norm(i), blk.norm1)
        _copy(layer.layernorm_after, blk.norm2)
        linears = target.linears(i).attention
        dim = int(blk.attn.qkv.in_features)
        for j, projection in enumerate((linears.q, linears.k, linears.v)):
            projection.weight.copy_(blk.attn.qkv.weight[j * dim:(j + 1) * dim])
            if blk.attn.qkv.bias is not None:
                projection.bias.copy_(blk.attn.qkv.bias[j * dim:(j + 1) * dim])
        _copy(linears.out, blk.attn.proj)
        layer.attention.relative_position_bias.relative_position_bias_table.copy_(
            blk.attn.relative_position_bias_table)
        fc1, fc2 = target.linears(i).mlp
        _copy(fc1, blk.mlp.fc1)
        _copy(fc2, blk.mlp.fc2)
    _copy(hf.swin.layernorm, model.norm)
    _copy(hf.classifier, model.head.fc)
    return hf.eval()
