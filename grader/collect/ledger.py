"""Which hand-in each `[[override]]` was given for.

An override stays in grading.toml across regrades, but the hand-in under it may change: a student hands in again
after the regrade request, and the points given for what the instructor read would then stand for a notebook nobody
read. `OUT/.work/overrides.json` keeps, for each override as written (student, assignment, exercise, points,
reason), the sha256 of the notebook it was first applied to. Whenever the hand-in differs from that one, the
override still applies (the instructor decided; a later run must not undo it), but the row gets a ★ note
(`NoteKind.OVERRIDE_CHANGED`, grader/collect/deadlines.py's `settle`) until the instructor confirms it for the new
hand-in by editing the override's points or reason, which makes it a new override.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from grader.collect.deadlines import Override
from grader.collect.files import read_regular
from grader.collect.submissions import MAX_NOTEBOOK_BYTES
from grader.results import write_whole

LEDGER = "overrides.json"


def hand_in_digest(notebook: Path | None) -> str:
    """The sha256 of a hand-in's notebook (its first MAX_NOTEBOOK_BYTES, never through a link); '' when none."""
    if notebook is None:
        return ""
    try:
        return hashlib.sha256(read_regular(notebook, MAX_NOTEBOOK_BYTES + 1)).hexdigest()
    except OSError as exc:
        return type(exc).__name__


class Ledger:
    """OUT/.work/overrides.json: override as written -> the hand-in it was first applied to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        self.unpinned: list[str] = []  # an override without hand_in, with the line that pins it (autograde prints)
        self.entries: dict[str, str] = ({str(k): str(v) for k, v in entries.items()}
                                        if isinstance(entries, dict) else {})

    def check(self, overrides: list[Override], notebook: Path | None) -> list[Override]:
        """`overrides` of one hand-in, each marked `changed` when the hand-in is not the one it was first given for."""
        if not overrides:
            return overrides
        digest = hand_in_digest(notebook)
        checked = []
        for o in overrides:
            if o.hand_in:  # pinned by the instructor: the one promise that holds across OUT folders and splits
                checked.append(replace(o, changed=o.hand_in != f"sha256:{digest}"))
                continue
            key = json.dumps([o.student, o.assignment, o.exercise, o.points, o.reason], ensure_ascii=False)
            first = self.entries.setdefault(key, digest)
            checked.append(replace(o, changed=first != digest))
            self.unpinned.append(f"{o.student}'s {o.exercise} in {o.assignment}: hand_in = \"sha256:{first}\"")
        return checked

    def save(self) -> None:
        """Write atomically: an interrupted run leaves the ledger as it was, or whole."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(self.path, json.dumps(self.entries, indent=1, sort_keys=True, ensure_ascii=False))
