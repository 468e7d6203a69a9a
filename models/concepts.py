"""Concept vectors in the pre-logits latent space of a timm ViT classifier, for the ``cdam`` method.

Latent of an image: ``model.forward_head(model.forward_features(x), pre_logits=True)`` — for a
``global_pool="token"`` model the final-norm [CLS] token, exactly what CDAM's concept score reads
(``dot(latent, vector)``, unnormalised).

Two kinds of concept vectors (:class:`ConceptHead`, rows of ``vectors [K, D]``):

* ``"mean"`` (CDAM): the mean latent of a few example images of the concept;
* ``"cav"`` (TCAV-style learned direction): the unit-norm weight vector of an L2-regularised logistic
  regression separating the concept's latents (label 1) from negatives (label 0): random images
  (a folder or a dataset) or, by default, the examples of the other concepts.

Images come from a folder per concept (``root/<concept>/*.png|jpg|...``) or from dataset classes. Images are in
[0, 1] and normalised here with the model's ``pretrained_cfg`` mean/std (``timm.data.resolve_data_config``);
folder images are resized (bicubic, squashed) to the model's input size.

``head.save(path)`` / ``ConceptHead.load(path)``; ``head.method(name)`` builds ``build_method("cdam",
concept=vector)``. ``train.py --concepts ...`` (:class:`ConceptsConfig`, :func:`build_concept_heads`) builds the
heads of a trained classifier and saves them next to it; ``evaluate.py --model.concepts FILE`` explains them
(a method entry ``{method: cdam, concept: <name>}``; :func:`load_concept_heads`, :func:`resolve_concept`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn

from methods import build_method
from models.checkpoint_io import plain, read_checkpoint

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
KINDS = ("mean", "cav")
FORMAT = "token_attributions.concepts/v1"


# ------------------------------------------------------------------------------------------ latents
def normalisation(model: nn.Module):
    """(mean, std, input_size) of ``model`` from its ``pretrained_cfg`` (via timm's ``resolve_data_config``)."""
    from timm.data import resolve_data_config

    cfg = resolve_data_config({}, model=model)
    return tuple(cfg["mean"]), tuple(cfg["std"]), tuple(cfg["input_size"])


@torch.no_grad()
def latents(model: nn.Module, images: Tensor, batch_size: int = 64, normalised: bool = False) -> Tensor:
    """Pre-logits latents ``[N, D]`` (float32) of images ``[N, 3, H, W]`` (in [0, 1] unless ``normalised``)."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [N, 3, H, W], got {tuple(images.shape)}")
    was_training = model.training
    model.eval()
    param = next(model.parameters())
    mean, std, _ = normalisation(model)
    mean_t = torch.tensor(mean, device=param.device, dtype=param.dtype).view(1, 3, 1, 1)
    std_t = torch.tensor(std, device=param.device, dtype=param.dtype).view(1, 3, 1, 1)
    out = []
    try:
        for start in range(0, images.shape[0], batch_size):
            x = images[start:start + batch_size].to(param.device, param.dtype)
            if not normalised:
                x = (x - mean_t) / std_t
            out.append(model.forward_head(model.forward_features(x), pre_logits=True).float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, model.num_features)


def load_image_folder(folder: Union[str, os.PathLike], size: Sequence[int], limit: Optional[int] = None) -> Tensor:
    """Images of ``folder`` (sorted by name) as ``[N, 3, H, W]`` in [0, 1], resized to ``size = (H, W)``."""
    from PIL import Image

    folder = Path(os.path.expanduser(str(folder)))
    if not folder.is_dir():
        raise FileNotFoundError(f"concept image folder {str(folder)!r} does not exist")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if limit is not None:
        files = files[:limit]
    if not files:
        raise ValueError(f"concept image folder {str(folder)!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    out = []
    for path in files:
        try:
            img = Image.open(path).convert("RGB").resize((int(size[1]), int(size[0])), Image.BICUBIC)
        except Exception as err:
            raise RuntimeError(f"cannot read image {str(path)!r}: {err}") from err
        out.append(torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1))
    return torch.stack(out)


def dataset_class_images(dataset, classes: Iterable[int], per_class: int) -> Dict[int, Tensor]:
    """The first ``per_class`` images (in index order) of each class of a dict dataset (``image``, ``label``)."""
    wanted = {int(c): [] for c in classes}
    for i in range(len(dataset)):
        item = dataset[i]
        label = int(item["label"])
        if label in wanted and len(wanted[label]) < per_class:
            wanted[label].append(item["image"])
        if all(len(v) == per_class for v in wanted.values()):
            break
    short = [c for c, v in wanted.items() if not v]
    if short:
        raise ValueError(f"dataset has no examples of classes {short}")
    return {c: torch.stack(v) for c, v in wanted.items()}


def learned_direction(positive: Tensor, negative: Tensor, c: float = 1.0) -> Tensor:
    """Unit-norm weight of an L2 logistic regression (sklearn, lbfgs, deterministic) separating ``positive``
    latents from ``negative`` ones (TCAV's concept activation vector)."""
    from sklearn.linear_model import LogisticRegression

    if positive.shape[0] < 1 or negative.shape[0] < 1:
        raise ValueError("a learned concept direction needs at least one positive and one negative example")
    x = torch.cat([positive, negative]).double().numpy()
    y = np.r_[np.ones(positive.shape[0]), np.zeros(negative.shape[0])]
    clf = LogisticRegression(C=c, max_iter=2000).fit(x, y)
    w = torch.from_numpy(clf.coef_[0]).float()
    return w / w.norm().clamp_min(1e-12)


# ------------------------------------------------------------------------------------------ head
class ConceptHead(nn.Module):
    """Named concept vectors ``[K, D]``; ``forward(latent) = latent @ vectors.T`` (the CDAM concept scores)."""

    def __init__(self, names: Sequence[str], vectors: Tensor, kind: str = "mean") -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if vectors.dim() != 2 or vectors.shape[0] != len(names):
            raise ValueError(f"vectors must be [len(names)={len(names)}, D], got {tuple(vectors.shape)}")
        if len(set(names)) != len(names):
            raise ValueError(f"concept names must be unique, got {list(names)}")
        self.names: List[str] = [str(n) for n in names]
        self.kind = kind
        self.register_buffer("vectors", vectors.detach().float().clone())

    def forward(self, latent: Tensor) -> Tensor:
        return latent @ self.vectors.to(latent.dtype).T

    def vector(self, name: str) -> Tensor:
        try:
            return self.vectors[self.names.index(name)]
        except ValueError:
            raise KeyError(f"unknown concept {name!r}; concepts: {', '.join(self.names)}") from None

    def method(self, name: str, **options):
        """``build_method("cdam", concept=<vector of name>)``."""
        return build_method("cdam", concept=self.vector(name), **options)

    # -------------------------------------------------------------------------------- constructors
    @classmethod
    def from_images(cls, model: nn.Module, examples: Dict[str, Tensor], kind: str = "mean",
                    negatives: Optional[Tensor] = None, c: float = 1.0) -> "ConceptHead":
        """Concepts from ``{name: images [N, 3, H, W] in [0, 1]}``. For ``kind="cav"`` the negatives are
        ``negatives`` (random images) or else the other concepts' examples."""
        if not examples:
            raise ValueError("no concepts given")
        lat = {name: latents(model, imgs) for name, imgs in examples.items()}
        names = list(lat)
        if kind == "mean":
            vectors = torch.stack([lat[n].mean(dim=0) for n in names])
        elif kind == "cav":
            neg_all = latents(model, negatives) if negatives is not None else None
            rows = []
            for n in names:
                others = [lat[m] for m in names if m != n] or [torch.zeros(0)]
                neg = neg_all if neg_all is not None else torch.cat(others)
                if neg.numel() == 0:
                    raise ValueError("kind='cav' with a single concept needs negatives (random images)")
                rows.append(learned_direction(lat[n], neg, c=c))
            vectors = torch.stack(rows)
        else:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return cls(names, vectors, kind=kind)

    @classmethod
    def from_folders(cls, model: nn.Module, root: Union[str, os.PathLike], kind: str = "mean",
                     concepts: Optional[Sequence[str]] = None, per_concept: Optional[int] = None,
                     negatives_folder: Optional[Union[str, os.PathLike]] = None, c: float = 1.0) -> "ConceptHead":
        """One sub-folder of ``root`` per concept (all sub-folders, sorted, unless ``concepts`` is given)."""
        root = Path(os.path.expanduser(str(root)))
        if not root.is_dir():
            raise FileNotFoundError(f"concept folder {str(root)!r} does not exist (expected root/<concept>/<images>)")
        names = list(concepts) if concepts is not None else sorted(p.name for p in root.iterdir() if p.is_dir())
        if negatives_folder is not None:
            names = [n for n in names if (root / n).resolve() != Path(negatives_folder).resolve()]
        if not names:
            raise ValueError(f"concept folder {str(root)!r} has no concept sub-folders")
        _, _, size = normalisation(model)
        examples = {n: load_image_folder(root / n, size[1:], per_concept) for n in names}
        negatives = load_image_folder(negatives_folder, size[1:]) if negatives_folder is not None else None
        return cls.from_images(model, examples, kind=kind, negatives=negatives, c=c)

    @classmethod
    def from_dataset(cls, model: nn.Module, dataset, classes: Sequence[int], per_concept: int = 10,
                     kind: str = "mean", names: Optional[Sequence[str]] = None, negatives: Optional[Tensor] = None,
                     c: float = 1.0) -> "ConceptHead":
        """Concepts = dataset classes (first ``per_concept`` examples of each, in index order)."""
        imgs = dataset_class_images(dataset, classes, per_concept)
        names = list(names) if names is not None else [f"class_{int(k)}" for k in classes]
        if len(names) != len(classes):
            raise ValueError("names must have one entry per class")
        return cls.from_images(model, {n: imgs[int(k)] for n, k in zip(names, classes)}, kind=kind,
                               negatives=negatives, c=c)

    # -------------------------------------------------------------------------------- files
    def save(self, path: Union[str, os.PathLike], **metadata) -> Path:
        """Write the concept file (plain values and tensors: ``torch.load(weights_only=True)`` reads it)."""
        path = Path(os.path.expanduser(str(path)))
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format": FORMAT, "names": list(self.names), "kind": self.kind, "vectors": self.vectors.cpu(),
                    "metadata": plain(dict(metadata), "metadata")}, path)
        return path

    @classmethod
    def load(cls, path: Union[str, os.PathLike], allow_pickle: bool = False) -> "ConceptHead":
        """The concept file at ``path`` (``allow_pickle``: see :func:`models.checkpoint_io.read_checkpoint`)."""
        path = Path(os.path.expanduser(str(path)))
        payload = read_checkpoint(path, allow_pickle=allow_pickle, what="concept file")
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise RuntimeError(f"{str(path)!r} is not a concept file written by ConceptHead.save")
        missing = [key for key in ("names", "vectors", "kind") if key not in payload]
        if missing or not isinstance(payload["vectors"], Tensor) or not isinstance(payload["names"], (list, tuple)):
            raise RuntimeError(f"concept file {str(path)!r} lacks {missing or 'names (a list) or vectors (a tensor)'}")
        try:
            head = cls(payload["names"], payload["vectors"], kind=payload["kind"])
        except (TypeError, ValueError) as err:
            raise RuntimeError(f"concept file {str(path)!r}: {err}") from err
        head.metadata = payload.get("metadata", {})
        return head


# ------------------------------------------------------------------------------------------ train.py
@dataclass
class ConceptsConfig:
    """What ``train.py --concepts`` builds after training (one :class:`ConceptHead` file per kind).

    Args:
        kinds: ``"mean"`` (CDAM's mean latent) and/or ``"cav"`` (learned direction).
        folder: ``root/<concept>/<images>``; when not given, the concepts are dataset classes.
        classes: the dataset classes used as concepts (default: every class); ignored with ``folder``.
        per_concept: example images per concept (dataset classes: the first ones of the validation split in
            index order; folders: the first ones by file name; ``None`` = all for folders).
        negatives_folder: random images, the negatives of ``cav`` (default: the other concepts' examples).
        c: inverse L2 strength of the ``cav`` logistic regression.
    """

    kinds: List[str] = field(default_factory=lambda: ["mean"])
    folder: Optional[str] = None
    classes: Optional[List[int]] = None
    per_concept: Optional[int] = 10
    negatives_folder: Optional[str] = None
    c: float = 1.0


def concept_name(text: str) -> str:
    """A concept name usable in method names and metric keys (letters, digits, ``_``, ``-``)."""
    name = re.sub(r"[^0-9A-Za-z_-]+", "_", str(text)).strip("_")
    if not name:
        raise ValueError(f"cannot make a concept name from {text!r}")
    return name


def build_concept_heads(model: nn.Module, spec: ConceptsConfig, dataset=None,
                        class_names: Optional[Sequence[str]] = None,
                        num_classes: Optional[int] = None) -> Dict[str, ConceptHead]:
    """``{kind: ConceptHead}`` of ``model`` per ``spec``: from ``spec.folder`` or from the classes of ``dataset``
    (a dict dataset with ``image`` in [0, 1] and ``label``)."""
    bad = [k for k in spec.kinds if k not in KINDS]
    if bad or not spec.kinds:
        raise ValueError(f"concept kinds must be a non-empty list from {KINDS}, got {spec.kinds}")
    if spec.folder is not None:
        return {kind: ConceptHead.from_folders(model, spec.folder, kind=kind, per_concept=spec.per_concept,
                                               negatives_folder=spec.negatives_folder, c=spec.c)
                for kind in spec.kinds}
    if dataset is None:
        raise ValueError("concepts from dataset classes need a dataset (or give --concepts.folder root/<concept>/)")
    if spec.per_concept is None or spec.per_concept < 1:
        raise ValueError(f"per_concept must be >= 1 for dataset classes, got {spec.per_concept}")
    classes = list(spec.classes) if spec.classes is not None else list(range(int(num_classes or 0)))
    if not classes:
        raise ValueError("no concept classes: give --concepts.classes or a model with num_classes")
    names = [concept_name(class_names[k]) if class_names is not None and k < len(class_names) else f"class_{k}"
             for k in classes]
    negatives = None
    if spec.negatives_folder is not None:
        _, _, size = normalisation(model)
        negatives = load_image_folder(spec.negatives_folder, size[1:])
    images = dataset_class_images(dataset, classes, spec.per_concept)  # read once, shared by the kinds
    examples = {n: images[int(k)] for n, k in zip(names, classes)}
    return {kind: ConceptHead.from_images(model, examples, kind=kind, negatives=negatives, c=spec.c)
            for kind in spec.kinds}


# ------------------------------------------------------------------------------------------ concept files
def load_concept_heads(files: Union[None, str, List[str]], allow_pickle: bool = False) -> Dict[str, ConceptHead]:
    """``{kind: ConceptHead}`` of concept files (one kind per file; a kind given twice is an error)."""
    if files is None:
        return {}
    heads: Dict[str, ConceptHead] = {}
    for path in [files] if isinstance(files, str) else list(files):
        head = ConceptHead.load(path, allow_pickle=allow_pickle)
        if head.kind in heads:
            raise ValueError(f"two concept files of kind {head.kind!r} (second: {path!r}); give one per kind")
        heads[head.kind] = head
    return heads


def resolve_concept(heads: Dict[str, ConceptHead], ref: str, method: str = "cdam") -> Tensor:
    """The vector named ``ref`` (``<name>`` or ``<kind>:<name>``) in ``heads``; errors list what exists."""
    if not heads:
        raise ValueError(f"method {method!r} names concept {ref!r} but no concept file is given "
                         "(--model.concepts FILE, written by train.py --concepts)")
    kind, _, name = ref.rpartition(":")
    if kind:
        if kind not in heads:
            raise KeyError(f"method {method!r}: no concept file of kind {kind!r} (loaded kinds: {sorted(heads)})")
        return heads[kind].vector(name)
    found = [k for k, head in heads.items() if name in head.names]
    if len(found) != 1:
        known = sorted(f"{k}:{n}" for k, head in heads.items() for n in head.names)
        what = "is ambiguous, use <kind>:<name>" if found else "is unknown"
        raise KeyError(f"method {method!r}: concept {name!r} {what}; concepts: {', '.join(known)}")
    return heads[found[0]].vector(name)
