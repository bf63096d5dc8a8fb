"""A method's tooltip, wherever a method is chosen (the Compression panel, the Sweep and Needle grid lists): its
one-line definition and its paper, then the same for the method a wrapper wraps. Rich text, so Qt wraps the long
titles instead of opening a tooltip as wide as the screen."""

from __future__ import annotations

import html

from kvcore.methods import Method, get


def method_tip(name: str) -> str:
    """'<b>adakv</b>: definition<br><i>Paper:</i> …' and, for a wrapper, its inner method's two lines."""
    method = get(name)
    rows = [_rows(method.name, method)]
    inner = getattr(method, "inner", None)
    if inner is not None:
        rows.append(_rows(f"over {inner.label}", inner))
    return "<qt>" + "<br><br>".join(rows) + "</qt>"


def _rows(label: str, method: Method) -> str:
    return (
        f"<b>{html.escape(label)}</b>: {html.escape(method.description)}<br>"
        f"<i>Paper:</i> {html.escape(method.paper)}"
    )
