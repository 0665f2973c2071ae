"""What a kernel's IOPub message stands for, as an nbformat output, with every string one UTF-8 can encode.

A student's cell can send any message (`kernel.session.send`), and a notebook can hold any string JSON can (half an
emoji: a lone UTF-16 surrogate). Nothing here raises on either: a malformed message stands for no output, and a
string is made safe (safe_text) before it reaches a file, a page or the kernel.
"""

from __future__ import annotations

import re

_UNWRITABLE = re.compile("[\ud800-\udfff\x00]")
_JSON_MIME = re.compile(r"application/(.*\+)?json")  # nbformat's mime types whose data is JSON, not text


def safe_text(text: str) -> str:
    """`text` with every lone UTF-16 surrogate (half an emoji, cut by an editor: JSON and Python hold it, UTF-8
    cannot encode it) and every NUL (Python compiles no source that holds one) as U+FFFD, so that a cell runs and no
    file, page or message written from it fails."""
    return _UNWRITABLE.sub("\ufffd", text)


def _text(value: object) -> str | None:
    """nbformat's multiline string (a string, or a list of strings) as one safe string; None for anything else."""
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        value = "".join(value)
    return safe_text(value) if isinstance(value, str) else None


def _safe_json(value: object) -> object:
    """JSON data of a display message with every string safe (safe_text)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, list):
        return [_safe_json(v) for v in value]
    if isinstance(value, dict):
        return {safe_text(str(k)): _safe_json(v) for k, v in value.items()}
    return value


def as_output(kind: str, content: dict) -> dict | None:
    """The nbformat output an IOPub message stands for, or None when it stands for none or is malformed (a
    `display_data` whose data is a string, a `stream` whose text is a list of numbers: a student's cell can send
    anything): such a message costs only its own output, never the grading."""
    if kind == "stream":
        name, text = content.get("name"), _text(content.get("text"))
        return {"output_type": "stream", "name": name, "text": text} if name in ("stdout", "stderr") and text is not None \
            else None
    if kind == "error":
        ename, evalue, traceback = content.get("ename"), content.get("evalue"), content.get("traceback", [])
        if not (isinstance(ename, str) and isinstance(evalue, str) and isinstance(traceback, list)
                and all(isinstance(line, str) for line in traceback)):
            return None
        return {"output_type": "error", "ename": safe_text(ename), "evalue": safe_text(evalue),
                "traceback": [safe_text(line) for line in traceback]}
    if kind not in ("display_data", "execute_result") or not isinstance(content.get("data"), dict):
        return None
    data: dict[str, object] = {}
    for mime, value in content["data"].items():
        shown = _safe_json(value) if isinstance(mime, str) and _JSON_MIME.fullmatch(mime) else _text(value)
        if not isinstance(mime, str) or shown is None:
            return None
        data[safe_text(mime)] = shown
    output: dict[str, object] = {"output_type": kind, "data": data, "metadata": {}}
    if kind == "execute_result":
        output["execution_count"] = None
    return output
