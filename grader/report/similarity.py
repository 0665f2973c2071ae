"""Similar hand-ins, for the class report: the answer cells of every graded hand-in compared with everyone else's.

It never changes a grade: it lists pairs an instructor may want to read side by side, with the lines they share.
The method is winnowing (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document
fingerprinting", SIGMOD 2003 — the algorithm behind MOSS), on tokens:

1. Tokens. Each answer cell goes through Python's tokenizer (a plain word/symbol split when it does not
   tokenize). Comments and blank lines are dropped; string literals become `S`; every name the student chose
   becomes `V`, while keywords, operators, numbers, attribute names (`.sum`, `.T`), builtins and the usual
   module names (`torch`, `np`, …) stay. Renaming variables, reformatting or adding comments changes nothing.
2. Fingerprints. Every run of K consecutive tokens (a k-gram) is hashed (blake2b, so the same class gives the
   same report on every machine); in each window of W consecutive hashes the smallest is kept (the rightmost on
   ties). Two cells that share a run of at least W + K - 1 tokens share a fingerprint; runs shorter than K never
   count. k-grams never span two cells.
3. Template removal. Every k-gram of the released notebook's code cells — the stubs with their signatures and
   docstrings, the visible tests, the code the lesson shows — is dropped from every hand-in, and so is every k-gram
   of the solution notebook (the reference answers), and every k-gram whose tokens all lie in such k-grams (where
   two pieces of the release meet, a visible test pasted below a stub). The obvious answer is the one two honest
   students write alike, and a copy of it cannot be told from it anyway (issue 36: two hand-ins that answered only
   01's two short exercises, each with the reference's one-liner, shared 74 tokens and were listed as a pair).
4. Common code is not evidence. A k-gram found in more than `common` hand-ins of the assignment (the larger of
   COMMON_MIN and COMMON_SHARE of the graded hand-ins) is dropped: that is how many honest answers to a short
   exercise coincide (`2 / torch.linalg.eigvalsh(H).max()` written by half the class).
5. A pair is listed when the fingerprints it shares cover at least SHARE of the smaller hand-in's fingerprints
   and the shared runs add up to at least MIN_TOKENS tokens in each hand-in.

What it catches, and what not (tests/test_similarity.py and tests/test_hardening_lms.py keep each true): a copy
with every name changed, comments added and lines re-wrapped (similarity 1.0 on notebook 01), with its
independent statements reordered too (0.83), or with a dead statement after every line (0.70) is listed; a copy whose
expressions are rewritten into equivalent ones throughout (operands swapped, a method for a function, temporaries
split out) is not, nor one of less than MIN_TOKENS tokens of code outside the release and the reference answers, nor
a copy of the reference answers.

How the thresholds were chosen (tests/test_similarity.py keeps each of these true): K = 8 tokens is about one
short expression (`2 * X.T @ (X @ w - y)` is 12), so an idiom never matches on its own; W = 5 makes every
shared run of 12 tokens or more certain to be seen. MIN_TOKENS = 60 is more than the whole reference answer of any
short exercise of the course (one of at most 60 tokens) covers once the template is removed, so a pair that
coincides on one short exercise is never listed on that alone. SHARE = 0.5 lies between what independent writings
share and what a copy shares: on notebook 01, correct answers written independently (the reference, the instructor
class's honest variants, one more student's own) share at most a quarter of their fingerprints with each other, a
copy with every name changed, comments added and lines re-wrapped shares more than nine tenths.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import keyword
import re
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

K = 8  # tokens in a k-gram: the shortest run that can match (the noise threshold)
W = 5  # window: every shared run of W + K - 1 tokens or more is found (the guarantee threshold)
SHARE = 0.5  # share of the smaller hand-in's fingerprints a pair must have in common
MIN_TOKENS = 60  # tokens of shared code, in each hand-in of the pair, before a pair is listed
COMMON_MIN, COMMON_SHARE = 4, 0.10  # a k-gram in more hand-ins than max(COMMON_MIN, COMMON_SHARE × class) is common
MAX_LINES = 30  # shared lines shown per cell and side
KEPT_NAMES = set(dir(builtins)) | {"torch", "np", "numpy", "math", "F", "nn", "optim", "self", "cls"}
WORDS = re.compile(r"\w+|[^\w\s]")
MAX_COMPARED_CHARS = 256 * 1024
METHOD = ("winnowing (Schleimer, Wilkerson and Aiken 2003) over Python tokens with the student's names and strings "
          "normalised; the release's code and the reference answers removed, and code many hand-ins share ignored")


@dataclass
class _Token:
    text: str
    line: int  # 0-based line of the cell it starts on


@dataclass
class HandIn:
    """One graded hand-in's answer cells as the comparison sees them."""

    student: str
    cells: dict[str, str]  # answer cell -> source
    grams: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # cell -> (start token, hash), template removed
    tokens: dict[str, list[_Token]] = field(default_factory=dict)


def tokens(source: str) -> list[_Token]:
    """The cell's tokens, normalised as the module docstring says (step 1); of its first MAX_COMPARED_CHARS only."""
    source = source[:MAX_COMPARED_CHARS]  # a hand-in may hold a 100 MB cell: its tokens would fill the memory
    found: list[_Token] = []
    try:
        stream = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [_Token(_normal(m.group(), ""), source.count("\n", 0, m.start())) for m in WORDS.finditer(source)]
    previous = ""
    for tok in stream:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER, tokenize.ENCODING):
            continue
        text = {tokenize.NEWLINE: ";", tokenize.INDENT: "{", tokenize.DEDENT: "}"}.get(tok.type, tok.string)
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
            text = "S"
        elif tok.type in (getattr(tokenize, "FSTRING_MIDDLE", -1), getattr(tokenize, "FSTRING_END", -1)):
            continue
        found.append(_Token(_normal(text, previous) if tok.type == tokenize.NAME else text, tok.start[0] - 1))
        previous = tok.string
    return found


def _normal(word: str, previous: str) -> str:
    if previous == "." or keyword.iskeyword(word) or word in KEPT_NAMES or not (word[:1].isalpha() or word[:1] == "_"):
        return word
    return "V"


def _hash(texts: list[str]) -> str:
    return hashlib.blake2b("\x1f".join(texts).encode(), digest_size=8).hexdigest()


def kgrams(toks: list[_Token]) -> list[tuple[int, str]]:
    """(start token, hash) of every k-gram of `toks`."""
    return [(i, _hash([t.text for t in toks[i:i + K]])) for i in range(len(toks) - K + 1)]


def winnow(grams: list[tuple[int, str]]) -> set[str]:
    """The fingerprints: the smallest hash of every window of W k-grams, the rightmost on ties (step 2)."""
    if len(grams) <= W:
        return {min(h for _, h in grams)} if grams else set()
    chosen = set()
    for start in range(len(grams) - W + 1):
        window = grams[start:start + W]
        smallest = min(h for _, h in window)
        chosen.add(max(i for i, h in window if h == smallest))
    return {h for i, h in grams if i in chosen}


def template_grams(release: Path) -> set[str]:
    """Every k-gram of the released notebook's code cells (step 3); empty when the release is not there."""
    if not release.is_file():
        return set()
    notebook = nbformat.read(release, as_version=4)
    return {h for cell in notebook.cells if cell.cell_type == "code" for _, h in kgrams(tokens(cell.source))}


def _prepare(student: str, answers: dict[str, str], template: set[str]) -> HandIn:
    hand_in = HandIn(student, answers)
    for cell, source in sorted(answers.items()):
        hand_in.tokens[cell] = tokens(source)
        grams = kgrams(hand_in.tokens[cell])
        # a k-gram made only of template tokens is template too: where two pieces of the release meet (a visible
        # test pasted below a stub) it is in no template k-gram, yet nothing of it is the student's
        released = {i + j for i, h in grams if h in template for j in range(K)}
        hand_in.grams[cell] = [(i, h) for i, h in grams
                               if h not in template and not all(i + j in released for j in range(K))]
    return hand_in


def _covered(hand_in: HandIn, shared: set[str]) -> dict[str, set[int]]:
    """cell -> indexes of the tokens inside a k-gram whose hash is in `shared`."""
    covered: dict[str, set[int]] = {}
    for cell, grams in hand_in.grams.items():
        spots = {i + j for i, h in grams if h in shared for j in range(K)}
        if spots:
            covered[cell] = spots
    return covered


def _lines(hand_in: HandIn, covered: dict[str, set[int]], cell: str) -> list[str]:
    source = hand_in.cells[cell].splitlines()
    numbers = sorted({hand_in.tokens[cell][i].line for i in covered.get(cell, ())})
    return [source[n] for n in numbers if n < len(source)][:MAX_LINES]


def compare(hand_ins: dict[str, dict[str, str]], release: Path, reference: Path | None = None) -> dict:
    """The similar pairs of one assignment: `hand_ins` is student -> answer cell -> source; `reference`: the
    solution notebook, whose code is no evidence either (step 3)."""
    template = template_grams(release) | (template_grams(reference) if reference else set())
    prepared = [_prepare(s, a, template) for s, a in sorted(hand_ins.items()) if a]
    common = max(COMMON_MIN, int(COMMON_SHARE * len(prepared)))
    holders: dict[str, set[int]] = defaultdict(set)
    for n, hand_in in enumerate(prepared):
        for grams in hand_in.grams.values():
            for _, h in grams:
                holders[h].add(n)
    rare = {h for h, who in holders.items() if len(who) <= common}
    prints = [set().union(*[winnow(g) for g in h.grams.values()]) for h in prepared]
    pairs_of: dict[tuple[int, int], None] = {}
    for h in rare:
        who = sorted(n for n in holders[h] if h in prints[n])
        for i, a in enumerate(who):
            for b in who[i + 1:]:
                pairs_of[a, b] = None
    pairs: list[dict] = []
    for a, b in sorted(pairs_of):
        shared_prints = prints[a] & prints[b] & rare
        smaller = min(len(prints[a]), len(prints[b]))
        share = len(shared_prints) / smaller if smaller else 0.0
        shared = {h for g in prepared[a].grams.values() for _, h in g} & {h for g in prepared[b].grams.values() for _, h in g}
        shared &= rare
        cover_a, cover_b = _covered(prepared[a], shared), _covered(prepared[b], shared)
        tokens_a, tokens_b = (sum(len(c) for c in cover.values()) for cover in (cover_a, cover_b))
        if share < SHARE or min(tokens_a, tokens_b) < MIN_TOKENS:
            continue
        pairs.append({
            "students": [prepared[a].student, prepared[b].student],
            "similarity": round(share, 3),
            "shared_tokens": min(tokens_a, tokens_b),
            "cells": [{"cell": cell, "lines": [_lines(prepared[a], cover_a, cell), _lines(prepared[b], cover_b, cell)]}
                      for cell in sorted(set(cover_a) & set(cover_b))],
        })
    pairs.sort(key=lambda p: (-p["similarity"], p["students"]))
    return {"compared": len(prepared), "common_above": common, "pairs": pairs}


def similarity(results: list[dict]) -> dict:
    """report.json's `similarity`: per assignment, the pairs of graded hand-ins whose answers are alike."""
    from grader.course import Assignment

    by_assignment: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
    for r in results:
        if r.get("answers"):
            by_assignment[r["assignment"]][r["student"]] = r["answers"]
    return {
        "method": METHOD,
        "thresholds": {"k_tokens": K, "window": W, "share": SHARE, "min_tokens": MIN_TOKENS,
                       "common": f"a k-gram in more than max({COMMON_MIN}, {COMMON_SHARE:.0%} of the hand-ins) is ignored"},
        "assignments": {name: compare(hand_ins, Assignment(name).release, Assignment(name).source)
                        for name, hand_ins in sorted(by_assignment.items())},
    }
