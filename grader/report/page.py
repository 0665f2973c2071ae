"""The one way the course writes an HTML page for people: inert (no script, nothing fetched), escaped, self-contained."""

from __future__ import annotations

import html

# Pages hold student text: they may show it, never run it or load anything because of it.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def html_page(title: str, style: str, body: str) -> str:
    """A complete page around `body` (already escaped HTML) under the course's Content-Security-Policy."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{html.escape(title)}</title><style>{style}</style></head><body>{body}</body></html>")
