"""Similar hand-ins, for the class report: the answer cells of every graded hand-in compared with everyone else's.

It never changes a grade: it lists pairs an instructor may want to read side by side, with the lines they share.
The method is winnowing (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document
fingerprinting", SIGMOD 2003 — the algorithm behind MOSS), on tokens:

1. Tokens. Each answer cell is first turned into the Python IPython runs (magics, `!shell` lines and `?` help
   become calls; when IPython is not installed they stay as they are), then goes through Python's tokenizer; a line
   that stops the tokenizer (an unclosed bracket or string) is dropped, that line alone, and the rest tokenized
   again (after MAX_DROPPED such lines the rest is split into words instead). A string literal passed to exec,
   eval or compile is tokenized as the code it holds. Comments and blank lines are dropped; string literals become
   `S`; every name the student chose becomes `V`, while keywords, operators, numbers, attribute names (`.sum`,
   `.T`), builtins and the usual module names (`torch`, `np`, …) stay. Renaming variables, reformatting or adding
   comments changes nothing.
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

import ast
import builtins
import functools
import hashlib
import io
import keyword
import re
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
MAX_DROPPED = 64  # lines of a cell dropped because they do not tokenize, before the rest is split into words instead
CODE_CALLS = {"exec", "eval", "compile"}  # a string literal given to one of these is read as code
MAX_NESTED_CODE = 3  # exec("exec('…')"): how deep
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


def tokens(source: str, depth: int = 0) -> list[_Token]:
    """The cell's tokens, normalised as the module docstring says (step 1); of its first MAX_COMPARED_CHARS only."""
    source = source[:MAX_COMPARED_CHARS]  # a hand-in may hold a 100 MB cell: its tokens would fill the memory
    lines = _python(source).splitlines(keepends=True)
    alive = list(range(len(lines)))
    for _ in range(MAX_DROPPED):
        stream = _stream("".join(lines[i] for i in alive))
        if isinstance(stream, int):  # the line where tokenizing failed: dropped, the rest tokenized again
            del alive[min(stream, len(alive) - 1)]
            continue
        return _normalised(stream, alive, depth)
    rest = "".join(lines[i] for i in alive)
    return [_Token(_normal(m.group(), ""), alive[rest.count("\n", 0, m.start())]) for m in WORDS.finditer(rest)]


@functools.lru_cache(maxsize=1)
def _transformer() -> Any:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # no IPython where the report is made: magics and shell lines are dropped as lines instead
        return None
    return TransformerManager()


def _python(source: str) -> str:
    """The cell as the kernel runs it: IPython's magics, `!shell` lines and `?` help turned into Python calls."""
    manager = _transformer()
    try:
        return manager.transform_cell(source) if manager is not None else source
    except Exception:  # IPython's transformers on a cell they cannot read: the plain source, lines dropped below
        return source


def _stream(text: str) -> list[tokenize.TokenInfo] | int:
    """Python's tokens of `text`, or the 0-based line that stops them: the first line of the logical line left
    unfinished (an unclosed bracket or string opened there), else the line the tokenizer names."""
    found: list[tokenize.TokenInfo] = []
    opened: int | None = None  # where the logical line being read began
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NEWLINE:
                opened = None
            elif opened is None and tok.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                opened = tok.start[0]
            found.append(tok)
    except tokenize.TokenError as exc:
        return (opened or exc.args[1][0]) - 1
    except SyntaxError as exc:  # IndentationError too
        return (opened or exc.lineno or 1) - 1
    return found


def _normalised(stream: list[tokenize.TokenInfo], alive: list[int], depth: int) -> list[_Token]:
    """The normalised tokens of a tokenized cell, each on its line of the cell (`alive`: its lines kept). A string
    literal passed to exec, eval or compile is code: its own tokens stand in for it."""
    found: list[_Token] = []
    previous, called = "", ""
    for tok in stream:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER, tokenize.ENCODING):
            continue
        line = alive[min(tok.start[0], len(alive)) - 1] if alive else 0
        text = {tokenize.NEWLINE: ";", tokenize.INDENT: "{", tokenize.DEDENT: "}"}.get(tok.type, tok.string)
        if tok.type == tokenize.STRING and called and depth < MAX_NESTED_CODE:
            inner = _literal_code(tok.string)
            if inner is not None:
                found += [_Token(t.text, line) for t in tokens(inner, depth + 1)]
                previous, called = tok.string, ""
                continue
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
            text = "S"
        elif tok.type in (getattr(tokenize, "FSTRING_MIDDLE", -1), getattr(tokenize, "FSTRING_END", -1)):
            continue
        found.append(_Token(_normal(text, previous) if tok.type == tokenize.NAME else text, line))
        called = previous if tok.string == "(" and previous in CODE_CALLS else ""
        previous = tok.string
    return found


def _literal_code(literal: str) -> str | None:
    """The text of a string literal, or None when it is not a plain one (an f-string, bytes not UTF-8)."""
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None


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
