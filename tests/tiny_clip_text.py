"""A tiny random CLIP's text tower read as a text classifier (``PromptScorer``: texts -> three fixed images as
classes) and a padded batch of two texts, for the tests that run a text metric on CLIP's text tower."""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor
from transformers import CLIPConfig, CLIPModel

from evaluation.classifier import TextClassifier
from models.clip import PromptScorer


def tiny_clip_text_classifier() -> Tuple[PromptScorer, TextClassifier, Dict[str, Tensor]]:
    """``(scorer, classifier, batch)``: seeded (0) weights and images; ids 28 / 29 start / end, 0 padding."""
    torch.manual_seed(0)
    clip = CLIPModel(CLIPConfig(text_config=dict(vocab_size=30, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=1, num_attention_heads=2,
                                                 max_position_embeddings=10, eos_token_id=29, bos_token_id=28,
                                                 pad_token_id=0),
                                vision_config=dict(image_size=16, patch_size=4, hidden_size=16, intermediate_size=32,
                                                   num_hidden_layers=1, num_attention_heads=2),
                                projection_dim=8)).eval()
    scorer = PromptScorer(clip, torch.randn(3, 3, 16, 16))
    classifier = TextClassifier(scorer, pad_token_id=0, batch_size=7)
    ids = torch.tensor([[28, 5, 6, 7, 8, 29, 0, 0], [28, 9, 10, 11, 12, 13, 14, 29]])
    mask, special = (ids > 0).long(), ((ids == 28) | (ids == 29) | (ids == 0)).long()
    batch = {"input_ids": ids, "attention_mask": mask, "special_tokens_mask": special, "label": torch.tensor([0, 2]),
             "index": torch.tensor([0, 1])}
    return scorer, classifier, batch
