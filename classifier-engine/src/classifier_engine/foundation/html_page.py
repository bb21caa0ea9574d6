"""One self-contained HTML page (tables and embedded PNG images): opens in any browser, offline, with no server."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Sequence

import numpy as np
from PIL import Image

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
.gallery { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; width: 264px; border: 1px solid #ddd; padding: 6px; }
figure img { width: 128px; height: 128px; image-rendering: pixelated; }
figcaption { font-size: 12px; word-break: break-all; }
.note { color: #666; }
.unusual-images { display: flex; flex-wrap: wrap; gap: 12px; }
.unusual { width: 140px; font-size: 12px; word-break: break-all; }
.unusual img { width: 128px; height: 128px; image-rendering: pixelated; }
"""


def png_uri(pixels: np.ndarray) -> str:
    """A ``data:`` URI of an (H, W, 3) uint8 image as PNG."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def escape(text: str) -> str:
    return html.escape(text)


def image(pixels: np.ndarray, alt: str) -> str:
    return f'<img src="{png_uri(pixels)}" alt="{html.escape(alt)}">'


def table(header: Sequence[str] | None, rows: Iterable[Sequence[object]], text_columns: int = 1, shades=None) -> str:
    """A table (no header row when ``header`` is None); the first ``text_columns`` columns are left-aligned.

    ``shades[r][c]`` in [0, 1] tints the cell of row ``r`` and number column ``c`` blue (a heat map).
    """
    head = ""
    if header is not None:
        kinds = ["text" if i < text_columns else "" for i in range(len(header))]
        cells = (f'<th class="{kind}">{html.escape(str(name))}</th>' for kind, name in zip(kinds, header, strict=True))
        head = f"<tr>{''.join(cells)}</tr>"
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, value in enumerate(row):
            style = ""
            if shades is not None and c >= text_columns:
                alpha = float(shades[r][c - text_columns])
                ink = "#fff" if alpha > 0.55 else "#222"
                style = f' style="background: rgba(30, 100, 220, {alpha:.2f}); color: {ink}"'
            cells.append(f'<td class="{"text" if c < text_columns else ""}"{style}>{html.escape(str(value))}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def figure(images: Sequence[str], caption_lines: Sequence[str]) -> str:
    captions = "<br>".join(html.escape(line) for line in caption_lines)
    return f"<figure>{''.join(images)}<figcaption>{captions}</figcaption></figure>"


def page(title: str, sections: Sequence[tuple[str, str]]) -> str:
    """The whole document: ``sections`` are (heading, HTML body) pairs."""
    parts = [f"<h2>{html.escape(heading)}</h2>{body}" for heading, body in sections]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n"
    )


def paragraph(text: str, note: bool = False) -> str:
    return f'<p class="{"note" if note else ""}">{html.escape(text)}</p>'
