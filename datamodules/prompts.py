"""Prompted text classification: a template with one ``{text}`` slot around a document's words, tokenized as one
string, each token marked as the text's (with its word) or the template's.

Template
--------
``"Review: {text}\\nSentiment:"``: the document's words joined by single spaces fill ``{text}`` (the only slot;
other braces are literal characters). The part after the slot is the **answer cue**: a decoder language model
is read out at its last token (the next-token logits there; ``evaluation.classifier.AnswerTokenClassifier``
scores each class's verbalizer token), so it must hold a non-whitespace character. Separate ``{text}`` from the
template's other characters by whitespace (``Review: {text}\\nSentiment:``): a token holding characters of both is
an error (:func:`encode_prompt`).

Tokens
------
The whole prompt is tokenized as one string with the tokenizer's own special tokens (a BOS, ...): the ids are
exactly ``tokenizer(prompt)["input_ids"]``, what the model reads from its own tokenizer (a byte-level BPE keeps
the space before each word inside the word's first token, as in any text). Each token belongs to what its
characters (its offsets) cover:

* a token whose non-whitespace characters lie in the text belongs to the **word** of the first of them (a
  whitespace-only token inside the text to the word after it);
* a token whose characters lie in the template, whitespace-only tokens there included, is a **template token**;
* the tokenizer's special tokens (``special_tokens_mask``) are neither.

Whitespace of the template that the tokenizer merges into a text token goes with that token (the space before
the first word in a byte-level BPE; Llama 3's and Qwen's pre-tokenizers join a punctuation mark with the newlines
after it, so a review ending in ``.`` before ``\\nSentiment:`` ends in the text token ``.\\n``): removing that
token removes the whitespace, never a template token.

Convention (what every test of the evaluation does with it): template tokens are marked special
(``special_tokens_mask`` 1, ``word_ids`` -1) and in ``template_mask``; the model reads them, but they are never
ranked, scored as rationale words or removed: the perturbation and ERASER tests rank and remove the text's tokens
only, and word scores (rationales, heatmaps) are over the text's words only. A method's raw token scores at
template positions are kept as it computes them (special tokens are not content positions of the adapters).

Chat template
-------------
``chat_prompt(tokenizer, template)`` (the datamodules' ``chat_template: true``) puts the template before the answer
cue's end into the tokenizer's chat template: the template is the user's message, rendered with the template's
system prompt (if it has one) and the generation prompt (``add_generation_prompt=True``), so the LM is read out
where its reply begins (the verbalizer's words are then written without a leading space: ``positive``). The
rendered string is the template: its role markers are the tokenizer's special tokens, the rest template tokens.

Truncation
----------
``max_length`` bounds the whole prompt. The text is cut, never the template: the prompt holds the longest head of
the document's words, whole words, that fits in ``max_length`` tokens (tokenized again as a string). A template
that leaves no room for the first word is an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: the template's one slot
SLOT = "{text}"
#: batch key: 1 at the template's tokens (``[B, N]``; 0 at the text, the tokenizer's special tokens, padding)
TEMPLATE_MASK = "template_mask"
#: what :func:`encode_prompt` marks a position as in its owner array
TEMPLATE, SPECIAL = -1, -2


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt template with one ``{text}`` slot (module docstring): ``prefix + text + cue``; ``require_cue=False``
    for a template that a chat template completes (:func:`chat_prompt`)."""

    template: str
    require_cue: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.template, str):
            raise ValueError(f"a prompt template is a string with one {SLOT} slot, got {type(self.template).__name__}")
        count = self.template.count(SLOT)
        if count != 1:
            raise ValueError(f"the prompt template must hold the slot {SLOT} exactly once (where the document's words "
                             f"go), found it {count} times in {self.template!r}")
        if self.require_cue and not self.cue.strip():
            raise ValueError(f"the prompt template {self.template!r} has no answer cue after {SLOT}: a language model "
                             "is read out at the prompt's last token, which must be the template's (e.g. "
                             "'Review: {text}\\nSentiment:')")

    @property
    def prefix(self) -> str:
        """The template before the slot."""
        return self.template.split(SLOT)[0]

    @property
    def cue(self) -> str:
        """The template after the slot: the answer cue."""
        return self.template.split(SLOT)[1]

    def fill(self, words: Sequence[str]) -> Tuple[str, np.ndarray]:
        """The prompt of ``words`` and, per character, its owner: the index of its word, :data:`TEMPLATE` for the
        template's characters (a space between two words belongs to the word after it)."""
        text = " ".join(words)
        owners = np.full(len(self.prefix) + len(text) + len(self.cue), TEMPLATE, dtype=np.int64)
        start = len(self.prefix)
        for w, word in enumerate(words):
            if w:
                owners[start - 1] = w   # the separating space
            owners[start:start + len(word)] = w
            start += len(word) + 1
        return self.prefix + text + self.cue, owners


def _token_owner(prompt: str, owners: np.ndarray, start: int, end: int, template: str) -> int:
    """The owner of the token over the characters ``[start, end)`` (module docstring); a token with an empty span
    (one a tokenizer inserts) is the owner of the character at ``start``."""
    span = list(range(start, min(end, len(prompt)))) if end > start else [min(start, len(prompt) - 1)]
    if not span or span[0] < 0:
        return TEMPLATE
    solid = [c for c in span if not prompt[c].isspace()]
    found = {int(owners[c]) for c in (solid or span)}
    if len(found) > 1 and TEMPLATE in found:
        if not solid:
            return TEMPLATE
        raise ValueError(f"the token {prompt[start:end]!r} holds characters of the prompt template {template!r} and "
                         "of the text: separate {text} from the template's other characters by whitespace, so that "
                         "the template's tokens stay apart from the text's")
    return int(owners[(solid or span)[0]])


def _encode(tokenizer: Any, template: PromptTemplate, words: Sequence[str]) -> Dict[str, List[int]]:
    prompt, char_owners = template.fill(words)
    enc = tokenizer(prompt, return_offsets_mapping=True, return_special_tokens_mask=True, verbose=False)
    owners = []
    for (start, end), special in zip(enc["offset_mapping"], enc["special_tokens_mask"]):
        owners.append(SPECIAL if special else _token_owner(prompt, char_owners, start, end, template.template))
    out = {key: list(enc[key]) for key in ("input_ids", "attention_mask", "token_type_ids") if key in enc}
    out.setdefault("attention_mask", [1] * len(out["input_ids"]))
    out["owners"] = owners
    return out


def encode_prompt(tokenizer: Any, template: PromptTemplate, words: Sequence[str], max_length: int
                  ) -> Dict[str, List[int]]:
    """The tokens of ``template`` filled with ``words`` (the head of them that fits ``max_length``; module
    docstring): ``input_ids``, ``attention_mask`` (``token_type_ids`` when the tokenizer gives them),
    ``special_tokens_mask`` (the tokenizer's special tokens and the template's), ``template_mask``, ``word_ids``
    (the index in ``words`` of each token's word, -1 at special and template tokens) and ``num_kept_words``."""
    words = list(words)
    enc = _encode(tokenizer, template, words)
    kept = len(words)
    if len(enc["input_ids"]) > max_length:
        text_tokens = [o for o in enc["owners"] if o >= 0]
        budget = max_length - (len(enc["owners"]) - len(text_tokens))
        kept = text_tokens[budget] if 0 <= budget < len(text_tokens) else 0   # the words whose tokens all fit
        while True:
            enc = _encode(tokenizer, template, words[:kept])
            if len(enc["input_ids"]) <= max_length or kept == 0:
                break
            kept -= 1
        if kept == 0 and words:
            raise ValueError(f"max_length={max_length} tokens cannot hold the prompt template {template.template!r} "
                             f"with the first word of the text ({words[0][:40]!r}): the template and the tokenizer's "
                             f"special tokens take {len(enc['input_ids'])} tokens; raise max_length")
    owners = enc.pop("owners")
    cue = [i for i, o in enumerate(owners) if o == TEMPLATE]
    text = [i for i, o in enumerate(owners) if o >= 0]
    if not cue or (text and cue[-1] < text[-1]):   # pragma: no cover - a non-blank cue always leaves a token
        raise ValueError(f"the prompt template {template.template!r} left no token after the text")
    enc["special_tokens_mask"] = [int(o < 0) for o in owners]
    enc[TEMPLATE_MASK] = [int(o == TEMPLATE) for o in owners]
    enc["word_ids"] = [o if o >= 0 else -1 for o in owners]
    enc["num_kept_words"] = kept
    return enc


def template_token_count(tokenizer: Any, template: PromptTemplate) -> int:
    """The tokens of the prompt with no text (the template and the tokenizer's special tokens)."""
    return len(_encode(tokenizer, template, [])["input_ids"])


def chat_prompt(tokenizer: Any, template: PromptTemplate) -> PromptTemplate:
    """``template`` as the user's message in the tokenizer's chat template, with the generation prompt (module
    docstring); an error when the tokenizer has no chat template or its rendering drops the ``{text}`` slot."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"chat_template: true needs a tokenizer with a chat template; "
                         f"{getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has none (an instruct "
                         "model's tokenizer, e.g. gguf:smollm2, has one)")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": template.template}], tokenize=False,
                                             add_generation_prompt=True)
    if not isinstance(rendered, str) or rendered.count(SLOT) != 1:
        raise ValueError(f"the tokenizer's chat template did not keep the slot {SLOT} of {template.template!r} "
                         f"exactly once: {rendered!r}")
    return PromptTemplate(rendered)


def as_template(prompt: Optional[str], require_cue: bool = True) -> Optional[PromptTemplate]:
    """The :class:`PromptTemplate` of a config value (``None``: no prompt)."""
    return None if prompt is None else PromptTemplate(prompt, require_cue)
