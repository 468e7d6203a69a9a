"""The dashboard's map gallery: the maps each run kept of the same few samples (``gallery.npz``,
:mod:`evaluation.gallery`), set side by side.

* methods (rows) x samples, each sample's column split by run: one sample's map in every run (e.g. every seed);
* per method, the sanity checks' maps of the same samples on the model randomised step by step (the original map,
  then each step of the top-down cascade), one table per run that kept them.

An image map is ``|a| / max |a|`` over the patch grid, each patch a block of pixels, blended 50/50 with the image
through the jet colour map and embedded as a PNG ``data:`` URI (no file, no network); a text map colours each word's
background by ``|a| / max |a|``. Every name and word is escaped (:func:`comparison.html.esc`'s rule), every ``id``
a slug.
"""
from __future__ import annotations

import base64
import html
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from callbacks.overlays import jet
from comparison.figures import slug
from comparison.runs import Run, RunLoadError
from evaluation.gallery import GALLERY_FILE, read_gallery

#: pixels a side of an image shown in the gallery (the map upscaled, nearest neighbour)
SIDE = 96


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def gallery_of(run: Run) -> Optional[Dict[str, np.ndarray]]:
    """The run's gallery (``None`` when it kept none: not a run folder, or an older run); a corrupt file is a
    :class:`RunLoadError` naming it."""
    path = Path(run.source) / GALLERY_FILE
    if run.kind != "folder" or not path.is_file():
        return None
    try:
        return read_gallery(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        raise RunLoadError(f"{path}: corrupt gallery ({err})") from None


def png_bytes(rgb: np.ndarray) -> bytes:
    """A PNG (8-bit RGB, no filter) of ``rgb`` uint8 ``[H, W, 3]``."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def magnitude(values: np.ndarray) -> np.ndarray:
    """``|a| / max |a|`` (NaN kept; an all-zero or all-NaN map stays 0 / NaN)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    top = np.nanmax(a) if np.any(np.isfinite(a)) else np.nan
    return a / top if np.isfinite(top) and top > 0 else a


def image_overlay(image: np.ndarray, scores: np.ndarray, grid: Sequence[int]) -> np.ndarray:
    """uint8 ``[SIDE, SIDE', 3]``: the patch map ``scores`` ``[rows * cols]`` as blocks over ``image``
    ``[H, W, 3]``, 50/50 through jet; NaN patches (not explained) grey."""
    h, w = image.shape[:2]
    rows, cols = (int(grid[0]), int(grid[1])) if len(grid) == 2 else (1, int(scores.size))
    heat = magnitude(scores[: rows * cols]).reshape(rows, cols)
    ys = np.minimum(np.arange(h) * rows // h, rows - 1)
    xs = np.minimum(np.arange(w) * cols // w, cols - 1)
    pixels = heat[ys][:, xs]
    colour = np.where(np.isfinite(pixels)[..., None], jet(np.nan_to_num(pixels)), 0.5)
    blended = 0.5 * image.astype(np.float64) / 255.0 + 0.5 * colour
    return upscale((np.clip(blended, 0, 1) * 255).round().astype(np.uint8))


def upscale(rgb: np.ndarray) -> np.ndarray:
    """``rgb`` repeated to about :data:`SIDE` pixels a side (nearest neighbour)."""
    scale = max(1, SIDE // max(rgb.shape[:2]))
    return np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)


def _img(rgb: np.ndarray, alt: str) -> str:
    uri = "data:image/png;base64," + base64.b64encode(png_bytes(rgb)).decode("ascii")
    return f"<img class='gmap' src='{uri}' alt='{_esc(alt)}' title='{_esc(alt)}'>"


def _words(words: Sequence[str], covered: Sequence[bool], scores: np.ndarray, limit: int = 40) -> str:
    heat = magnitude(scores)
    spans = []
    for j, (word, on) in enumerate(zip(words, covered)):
        if not on or j >= limit:
            continue
        v = float(heat[j]) if j < heat.size and np.isfinite(heat[j]) else float("nan")
        style = "background:#eee" if v != v else f"background:rgba(220,40,40,{v:.2f})"
        spans.append(f"<span class='gword' style='{style}'>{_esc(word)}</span>")
    more = " …" if sum(bool(c) for c in covered) > limit else ""
    return f"<div class='gtext'>{' '.join(spans)}{more}</div>"


def _cell(gallery: Dict[str, np.ndarray], k: int, scores: Optional[np.ndarray], alt: str) -> str:
    if scores is None:
        return "<td class='missing'>missing</td>"
    if "image" in gallery:
        return f"<td class='gcell'>{_img(image_overlay(gallery['image'][k], scores, gallery['grid']), alt)}</td>"
    return f"<td class='gcell'>{_words(gallery['words'][k], gallery['covered'][k], scores)}</td>"


def _sample_label(gallery: Dict[str, np.ndarray], k: int) -> str:
    return (f"sample {int(gallery['ids'][k])}<br><span class='note'>label {int(gallery['labels'][k])}, predicted "
            f"{int(gallery['predicted'][k])}</span>")


def _position(gallery: Dict[str, np.ndarray], sample: int) -> int:
    """The row of dataset index ``sample`` in the gallery (0 when it has none: its cells are then missing)."""
    where = np.flatnonzero(gallery["ids"] == sample)
    return int(where[0]) if where.size else 0


def _row(gallery: Dict[str, np.ndarray], name: str, sample: int) -> Optional[np.ndarray]:
    """The row of dataset index ``sample`` in the gallery array ``name`` (``None`` when it has none)."""
    where = np.flatnonzero(gallery["ids"] == sample)
    if name not in gallery or where.size == 0:
        return None
    return gallery[name][int(where[0])]


def gallery_html(runs: Sequence[Run], galleries: Dict[str, Dict[str, np.ndarray]]) -> str:
    """The gallery section (module docstring) of the runs that kept one."""
    names = [r.name for r in runs if r.name in galleries]
    first = galleries[names[0]]
    samples = [int(i) for i in first["ids"]]
    methods = sorted({key.split("/", 1)[1] for g in galleries.values() for key in g if key.startswith("map/")})
    out = ["<p class='note'>the same samples (dataset indices) in every run: |a| / max |a| per map, the patch grid "
           "over the image (jet, blended 50/50) or each word's background; the samples' labels and predictions "
           f"from {_esc(names[0])}</p>", "<h3>maps across runs</h3>"]
    span = len(names)
    head = "".join(f"<th colspan='{span}'>{_sample_label(first, k)}</th>" for k in range(len(samples)))
    run_head = "".join(f"<th>{_esc(n)}</th>" for _ in samples for n in names)
    rows = []
    if "image" in first:
        rows.append("<tr><td class='name'>image</td>" + "".join(
            f"<td class='gcell' colspan='{span}'>{_img(upscale(first['image'][k]), 'image')}"
            "</td>" for k in range(len(samples))) + "</tr>")
    for method in methods:
        cells = "".join(_cell(galleries[n], _position(galleries[n], sample),
                              _row(galleries[n], f"map/{method}", sample), f"{method}, sample {sample}, {n}")
                        for sample in samples for n in names)
        rows.append(f"<tr data-method='{_esc(method)}'><td class='name'>{_esc(method)}</td>{cells}</tr>")
    out.append(f"<table class='gallery' id='gallery-runs'><tr><th class='name' rowspan='2'>method</th>{head}</tr>"
               f"<tr>{run_head}</tr>{''.join(rows)}</table>")
    randomised = [(n, galleries[n]) for n in names if any(k.startswith("randomised/") for k in galleries[n])]
    for name, gallery in randomised:
        steps = [str(s) for s in gallery["steps"]]
        out.append(f"<h3>maps on the randomised model: {_esc(name)}</h3><p class='note'>the sanity checks' "
                   "cascade from the head down: each column randomises one more group (the last: every parameter); "
                   "a map that depends on the model changes</p>")
        step_head = "<th>original</th>" + "".join(f"<th>{_esc(s)}</th>" for s in steps)
        for key in sorted(k for k in gallery if k.startswith("randomised/")):
            method = key[len("randomised/"):]
            rows = []
            for k, sample in enumerate(int(i) for i in gallery["ids"]):
                cells = _cell(gallery, k, _row(gallery, f"map/{method}", sample), f"{method}, sample {sample}")
                cells += "".join(_cell(gallery, k, gallery[key][k, s], f"{method}, sample {sample}, {step}")
                                 for s, step in enumerate(steps))
                rows.append(f"<tr><td class='name'>{_sample_label(gallery, k)}</td>{cells}</tr>")
            out.append(f"<h4>{_esc(method)}</h4><table class='gallery' id='randomised-{slug(name + '-' + method)}' "
                       f"data-method='{_esc(method)}'><tr><th class='name'>sample</th>{step_head}</tr>"
                       f"{''.join(rows)}</table>")
    return "\n".join(out)


def galleries_of(runs: Sequence[Run]) -> Dict[str, Dict[str, np.ndarray]]:
    """``{run name: gallery}`` of the runs that kept one."""
    out = {}
    for run in runs:
        gallery = gallery_of(run)
        if gallery is not None:
            out[run.name] = gallery
    return out


def gallery_sections(runs: Sequence[Run], galleries: Dict[str, Dict[str, np.ndarray]]) -> List[tuple]:
    """``[(id, heading, html)]``: the gallery section when a run kept maps."""
    return [("map gallery", "map gallery", gallery_html(runs, galleries))] if galleries else []
