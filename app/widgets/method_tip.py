"""A method's tooltip, wherever a method is chosen (the Compression panel, the Sweep and Needle grid lists, the
Timeline's decoding policies): its one-line definition and its paper, then the same for the method a wrapper wraps. Rich text, so Qt wraps the long
titles instead of opening a tooltip as wide as the screen."""

from __future__ import annotations

import html

from kvcore.defaults import DECODE_POLICY_HELP
from kvcore.methods import Method, available, get


def method_tip(name: str) -> str:
    """'<b>adakv</b>: definition<br><i>Paper:</i> …' and, for a wrapper, its inner method's two lines."""
    method = get(name)
    rows = [_rows(method.name, method)]
    inner = getattr(method, "inner", None)
    if inner is not None:
        rows.append(_rows(f"over {inner.label}", inner))
    return "<qt>" + "<br><br>".join(rows) + "</qt>"


def policy_tip(name: str) -> str:
    """A decoding policy's tooltip (the Timeline's chooser): a prefill method re-scored while decoding says so, then
    its own definition and paper; a decoding-only policy (h2o_online, dms, cam) its declared ones."""
    if name in DECODE_POLICY_HELP:
        definition, paper = DECODE_POLICY_HELP[name]
        return f"<qt><b>{html.escape(name)}</b>: {html.escape(definition)}<br><i>Paper:</i> {html.escape(paper)}</qt>"
    if name not in available():
        return ""
    how = (
        "the rolling window while decoding"
        if name == "streaming_llm"
        else "re-scores the whole cache every interval while decoding, the latest tokens' queries as its window "
        "(kvpress's DecodingPress)"
    )
    return f"<qt><b>{html.escape(name)}</b> {html.escape(how)}<br><br>" + method_tip(name).removeprefix(
        "<qt>"
    )


def _rows(label: str, method: Method) -> str:
    return (
        f"<b>{html.escape(label)}</b>: {html.escape(method.description)}<br>"
        f"<i>Paper:</i> {html.escape(method.paper)}"
    )
