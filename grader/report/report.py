"""The class report: `python -m grader report GRADED_DIR` (autograde writes it too) → GRADED_DIR/report/.

One HTML page that opens offline — figures are PNG data URIs drawn with matplotlib's Agg backend, no
script, nothing fetched (its Content-Security-Policy forbids both) — and report.json with the same data:

- per assignment: a histogram of the totals (after any late penalty) and the lateness of the hand-ins;
- per exercise: the mean, how many hand-ins earned full / partial / zero points, a discrimination index,
  and why the others failed: each known mistake (grader/mutants/*.toml) with its count and share, "not answered"
  (the stub still raised NotImplementedError) and "unrecognised" (a failure no known mistake explains);
- status counts (ok, tampered, timeout, …) with the students listed, and a "look at these" list;
- similar hand-ins: pairs whose answer cells share more code than honest answers do, with the shared lines
  (grader/report/similarity.py; never a grade change).

Statistics count *graded hand-ins*: rows where a notebook was graded (not "no submission", "missing
notebook", "invalid notebook", refused or unknown folders). The discrimination index is the item–rest
correlation: Pearson's r between the exercise's points and the rest of the hand-in's points (the total
before the late penalty, less this exercise), which is the point-biserial correlation when an exercise
is all-or-nothing, as every exercise here is. It is left empty when either side has no spread.
Everything comes from GRADED_DIR/results.json; nothing in the page depends on when it was made, so the
same results give the same bytes (`grader merge` relies on it).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import cast

from grader.report.page import html_page
from grader.report.similarity import similarity
from grader.results import Note, NoteKind, Result, points, write_whole

DISCRIMINATION = ("item–rest correlation: Pearson's r between the exercise's points and the rest of the hand-in's "
                  "points (raw total less this exercise) over graded hand-ins — the point-biserial correlation for an "
                  "all-or-nothing exercise; empty when either has no spread")
# Why a hand-in with a due date has no lateness (the report's and `export`'s words; grader/collect/deadlines.py).
NO_HAND_IN_TIME = ("Moodle's Download all submissions gives no hand-in times (nor does a folder without nbgrader's "
                   "timestamp.txt), so no lateness was computed against the due date and no late penalty taken: "
                   "check late hand-ins in Moodle's grading table")


def untimed_note(results: list[Result]) -> str:
    """What autograde's terminal says of hand-ins that had a due date but no hand-in time (a Moodle zip's), or ''."""
    count = sum(bool(r.lateness.get("due") and not r.lateness.get("submitted")) for r in results)
    return f"{count} hand-in(s) had a due date but no hand-in time: {NO_HAND_IN_TIME}" if count else ""


# The status table's rows: "ok", then every kind of note in NoteKind's order.
ORDER = ["ok", *(kind.value for kind in NoteKind)]
STYLE = """
body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#111}
table{border-collapse:collapse;margin:.5rem 0 1rem}\
td,th{border:1px solid #bbb;padding:.25rem .55rem;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#555;font-size:.9rem}img{max-width:100%}
details{margin:.2rem 0}summary{cursor:pointer}
"""


def _raw_total(r: dict) -> float:
    return sum(r.get("scores", {}).values())


def _total(r: dict) -> float:
    return round(_raw_total(r) - r.get("penalty", 0.0), 6)


def _who(r: dict) -> str:
    return f"{r['student']}/{r['assignment']}"


def _pearson(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(sxx * syy), 3)


def _whys(assignment: str) -> dict[str, str]:
    """Known mistake name → the misconception in plain words (empty for an assignment the course no longer has)."""
    from grader.author.mutants import load_mutants
    from grader.course import assignments

    known = {a.name: a for a in assignments()}
    return {m.name: m.why for m in load_mutants(known[assignment])} if assignment in known else {}


def analyse(results: list[dict]) -> dict:
    """The report's data (what report.json holds) from the rows of results.json."""
    results = sorted(results, key=lambda r: (r["student"], r["assignment"]))
    status: dict[str, list[str]] = {c: [] for c in ORDER}
    look_at: list[dict] = []
    by_assignment: dict[str, list[dict]] = defaultdict(list)
    graded_rows: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        notes = [Note.from_json(n) for n in r.get("status", [])]
        kinds = sorted({n.kind for n in notes}, key=list(NoteKind).index)
        for kind in kinds:
            status[kind.value].append(_who(r) + ": " + "; ".join(n.text for n in notes if n.kind == kind))
        if not kinds:
            status["ok"].append(_who(r))
        by_assignment[r["assignment"]].append(r)
        graded = r.get("max_scores") and all(kind.graded for kind in kinds)
        if graded:
            graded_rows[r["assignment"]].append(r)
        for note in notes:
            if note.kind.look_at:
                look_at.append({"student": r["student"], "assignment": r["assignment"], "why": note.text})
        if graded and _raw_total(r) == 0 and r.get("answered"):
            look_at.append({"student": r["student"], "assignment": r["assignment"],
                            "why": f"zero points after a non-blank hand-in ({len(r['answered'])} answer cell(s) changed)"})
        late_note = r.get("lateness", {}).get("note", "")
        if graded and late_note.startswith("hand-in time"):
            look_at.append({"student": r["student"], "assignment": r["assignment"], "why": late_note,
                            "no_time": _no_time(r)})
    assignments = {}
    for name in sorted(by_assignment):
        rows = graded_rows.get(name, [])
        maxima: dict[str, float] = next((r["max_scores"] for r in by_assignment[name] if r.get("max_scores")), {})
        assignments[name] = _assignment(rows, maxima, len(by_assignment[name]), _whys(name) if maxima else {})
    return {
        "rows": len(results),
        "graded": sum(len(v) for v in graded_rows.values()),
        "discrimination": DISCRIMINATION,
        "assignments": assignments,
        "status": {c: {"count": len(v), "students": v} for c, v in status.items() if v},
        "look_at": look_at,
        "similarity": similarity(results),
    }


def _no_time(r: dict) -> bool:
    """Whether the row had a due date but collection found no hand-in time (a Moodle zip's hand-in, or a folder's
    without timestamp.txt)."""
    return bool(r.get("lateness", {}).get("due")) and not r.get("submitted_at", "").strip()


def _assignment(rows: list[dict], maxima: dict[str, float], row_count: int, whys: dict[str, str]) -> dict:
    totals = [_total(r) for r in rows]
    max_total = sum(maxima.values())
    exercises = {}
    for test, top in maxima.items():
        earned = [r["scores"].get(test, 0.0) for r in rows]
        rest = [_raw_total(r) - p for r, p in zip(rows, earned)]
        failed = [r for r, p in zip(rows, earned) if p < top]
        named: dict[str, list[str]] = defaultdict(list)
        unanswered, unrecognised = [], []
        for r in failed:
            mistake = r.get("mistakes", {}).get(test)
            if mistake:
                named[mistake].append(r["student"])
            elif test in r.get("unanswered", []):
                unanswered.append(r["student"])
            else:
                unrecognised.append(r["student"])
        exercises[test] = {
            "max": top,
            "mean": round(sum(earned) / len(earned), 3) if earned else None,
            "full": sum(p == top for p in earned),
            "partial": sum(0 < p < top for p in earned),
            "zero": sum(p == 0 for p in earned),
            "discrimination": _pearson(earned, rest),
            "misconceptions": [{"mistake": m, "why": whys.get(m, ""), "count": len(s),
                                "share": round(len(s) / len(rows), 3), "students": s}
                               for m, s in sorted(named.items(), key=lambda kv: (-len(kv[1]), kv[0]))],
            "not_answered": {"count": len(unanswered), "students": unanswered},
            "unrecognised": {"count": len(unrecognised), "students": unrecognised},
        }
    counts = Counter(totals)
    late = [r for r in rows if (r.get("lateness", {}).get("late_by") or 0) > 0]
    return {
        "rows": row_count,
        "graded": len(rows),
        "max_total": max_total,
        "mean_total": round(sum(totals) / len(totals), 3) if totals else None,
        "median_total": _median(totals),
        "totals": [[t, counts[t]] for t in sorted(counts)],
        "exercises": exercises,
        "lateness": {
            "with_due_date": sum(bool(r.get("lateness", {}).get("due")) for r in rows),
            "no_time": sum(_no_time(r) for r in rows),
            "timed": sum(bool(r.get("lateness", {}).get("submitted")) for r in rows),
            "late": len(late),
            "penalised": sum(r.get("penalty", 0) > 0 for r in rows),
            "points_taken": round(sum(r.get("penalty", 0) for r in rows), 2),
            "students": [{"student": r["student"], "late_by_h": r["lateness"]["late_by"], "penalty": r.get("penalty", 0),
                          "note": r["lateness"].get("note", "")} for r in late],
        },
    }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# --- figures ----------------------------------------------------------------------------------------------

def _png(fig) -> str:
    buffer = io.BytesIO()
    # No "Software" stamp or date: the same data gives the same bytes.
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def load_plotting() -> None:
    """Import what the figures are drawn with: a second of imports (autograde has it done while its workers grade)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot


def _figures(name: str, data: dict) -> tuple[str, str]:
    """(score histogram, per-exercise outcome bars) of one assignment, as PNG data URIs."""
    load_plotting()
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer

    with plt.rc_context({"font.size": 11, "axes.spines.top": False, "axes.spines.right": False}):
        fig, ax = plt.subplots(figsize=(6.4, 3.2))
        top = data["max_total"]
        totals = [t for t, c in data["totals"] for _ in range(c)]
        edges = [i for i in range(0, math.floor(top) + 2)]
        counts, _, bars = ax.hist(totals, bins=edges, color="#4c72b0", edgecolor="white", align="left")
        # hist of one data set with the default histtype draws one BarContainer (the stub allows every case)
        ax.bar_label(cast(BarContainer, bars), labels=[str(int(c)) if c else "" for c in counts], fontsize=9)
        ax.set_xticks(edges[:-1])
        ax.set_xlabel(f"total points (of {top:g}, after any late penalty; bin k holds k ≤ total < k+1)")
        ax.set_ylabel("hand-ins")
        ax.set_title(f"{name}: {data['graded']} graded hand-ins")
        fig.tight_layout()
        histogram = _png(fig)
        plt.close(fig)

        exercises = list(data["exercises"])
        fig, ax = plt.subplots(figsize=(6.4, 0.55 * len(exercises) + 1.2))
        left = [0] * len(exercises)
        for key, colour in (("full", "#55a868"), ("partial", "#dd8452"), ("zero", "#c44e52")):
            values = [data["exercises"][e][key] for e in exercises]
            ax.barh(exercises, values, left=left, color=colour, label=key)
            left = [a + b for a, b in zip(left, values)]
        ax.invert_yaxis()
        ax.set_xlabel("hand-ins")
        ax.legend(ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        fig.tight_layout()
        outcomes = _png(fig)
        plt.close(fig)
    return histogram, outcomes


# --- the page ---------------------------------------------------------------------------------------------

def _e(value: object) -> str:
    return html.escape(str(value))


def _list(items: list[str]) -> str:
    return ", ".join(_e(i) for i in items)


def _students(items: list[str], limit: int = 12) -> str:
    if len(items) <= limit:
        return _list(items)
    return f"<details><summary>{len(items)} students</summary>{_list(items)}</details>"


def render(data: dict) -> str:
    """The report page (escaped, self-contained) for `analyse()`'s data."""
    parts = [f"<h1>Class report</h1><p>{data['rows']} rows of grades.csv, {data['graded']} graded hand-ins "
             "(statistics count graded hand-ins only).</p>"]
    # One row per reason: a note many hand-ins share (a stale release, a broken grader) shows as one line.
    groups: dict[str, list[str]] = defaultdict(list)
    for x in data["look_at"]:
        groups[x["why"]].append(f"{x['student']}/{x['assignment']}")
    half = max(3, (data["graded"] + 1) // 2)
    # a note most of the class shares points at the release or the grader, except a missing time: Moodle gives none
    no_time = {x["why"] for x in data["look_at"] if x.get("no_time")}

    def hint(why: str, who: list[str]) -> str:
        if why in no_time:
            return f" <b>({_e(NO_HAND_IN_TIME)})</b>"
        return " <b>(half the class or more: the release or the grader, not the students?)</b>" if len(who) >= half else ""

    parts.append("<h2>Look at these</h2>" + (
        "<table><tr><th>why</th><th>hand-ins</th><th>who (student/assignment)</th></tr>" + "".join(
            f"<tr><td>{_e(why)}{hint(why, who)}</td><td class=n>{len(who)}</td>"
            f"<td>{_students(who)}</td></tr>"
            for why, who in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))
        + "</table>" if groups else "<p>nothing: no tampering, interference, timeouts, crashes, limits or grader errors, "
                                    "and no zero after a non-blank hand-in.</p>"))
    parts.append("<h2>Status</h2><table><tr><th>status</th><th>rows</th><th>who (student/assignment: note)</th></tr>" + "".join(
        f"<tr><td>{_e(cat)}</td><td class=n>{v['count']}</td><td>{_students(v['students'])}</td></tr>"
        for cat, v in data["status"].items()) + "</table>")
    for name, a in data["assignments"].items():
        parts.append(f"<h2>{_e(name)}</h2>")
        if not a["graded"]:
            parts.append(f"<p>{a['rows']} rows, no graded hand-in.</p>")
            continue
        histogram, outcomes = _figures(name, a)
        parts.append(f"<p>{a['graded']} graded hand-ins of {a['rows']} rows; mean total {points(a['mean_total'])}, "
                     f"median {points(a['median_total'])} of {points(a['max_total'])}.</p>"
                     f'<img alt="histogram of the totals of {_e(name)}" src="{histogram}">'
                     f'<img alt="full, partial and zero points per exercise of {_e(name)}" src="{outcomes}">')
        rows = []
        for test, x in a["exercises"].items():
            why = "".join(f"<li>{m['count']} ({100 * m['share']:.0f} %) × <b>{_e(m['mistake'])}</b>"
                          f"{' — ' + _e(m['why']) if m['why'] else ''}"
                          f" <span class=muted>({_students(m['students'])})</span></li>" for m in x["misconceptions"])
            for key, label in (("not_answered", "not answered (NotImplementedError)"), ("unrecognised", "unrecognised")):
                if x[key]["count"]:
                    why += (f"<li>{x[key]['count']} × {label} <span class=muted>({_students(x[key]['students'])})"
                            "</span></li>")
            disc = "—" if x["discrimination"] is None else f"{x['discrimination']:.2f}"
            rows.append(f"<tr><td>{_e(test)}</td><td class=n>{points(x['max'])}</td><td class=n>{x['mean']:.2f}</td>"
                        f"<td class=n>{x['full']}</td><td class=n>{x['partial']}</td><td class=n>{x['zero']}</td>"
                        f"<td class=n>{disc}</td><td><ul>{why}</ul></td></tr>")
        parts.append("<table><tr><th>exercise</th><th>points</th><th>mean</th><th>full</th><th>partial</th><th>zero</th>"
                     "<th>discrimination</th><th>why the others failed (hand-ins, share of graded hand-ins)</th></tr>"
                     + "".join(rows) + "</table>"
                     f"<p class=muted>Discrimination: {_e(data['discrimination'])}.</p>")
        late = a["lateness"]
        if late["with_due_date"]:
            said = [f"{late['with_due_date']} graded hand-ins had a due date"]
            if late["no_time"]:
                said.append(f"{late['no_time']} of them have no hand-in time: {NO_HAND_IN_TIME}")
            if late["timed"]:
                said.append(f"{'of the ' + str(late['timed']) + ' with a hand-in time, ' if late['no_time'] else ''}"
                            f"{late['late']} came after the due date, {late['penalised']} lost points "
                            f"({points(late['points_taken'])} in all)")
            parts.append(f"<h3>Lateness</h3><p>{_e('; '.join(said))}.</p>")
            if late["students"]:
                parts.append("<table><tr><th>student</th><th>late by (h)</th><th>penalty</th><th>why</th></tr>" + "".join(
                    f"<tr><td>{_e(s['student'])}</td><td class=n>{points(s['late_by_h'])}</td>"
                    f"<td class=n>{points(s['penalty'])}</td><td>{_e(s['note'])}</td></tr>" for s in late["students"])
                    + "</table>")
    parts.append(_similar(data["similarity"]))
    return html_page("Class report", STYLE, "".join(parts))


def _similar(data: dict) -> str:
    """The similar pairs of each assignment, with the lines each side shares (escaped)."""
    t = data["thresholds"]
    head = (f"<h2>Similar hand-ins</h2><p class=muted>Answer cells compared by {_e(data['method'])}. A pair is listed "
            f"when it shares at least {t['share']:.0%} of the smaller hand-in's fingerprints and {t['min_tokens']} tokens "
            f"of code ({t['k_tokens']}-token k-grams, window {t['window']}; {_e(t['common'])}). Grades are not changed: "
            "read the pair side by side.</p>")
    rows = []
    for name, a in data["assignments"].items():
        for pair in a["pairs"]:
            shared = "".join(f"<details><summary>{_e(c['cell'])}</summary><table><tr><th>{_e(pair['students'][0])}</th>"
                             f"<th>{_e(pair['students'][1])}</th></tr><tr><td><pre>{_e(chr(10).join(c['lines'][0]))}"
                             f"</pre></td><td><pre>{_e(chr(10).join(c['lines'][1]))}</pre></td></tr></table></details>"
                             for c in pair["cells"])
            rows.append(f"<tr><td>{_e(name)}</td><td>{_e(' and '.join(pair['students']))}</td>"
                        f"<td class=n>{pair['similarity']:.0%}</td><td class=n>{pair['shared_tokens']}</td>"
                        f"<td>{shared}</td></tr>")
    if not rows:
        compared = ", ".join(f"{a['compared']} of {_e(n)}" for n, a in data["assignments"].items()) or "none"
        return head + f"<p>No pair above the threshold (hand-ins compared: {compared}).</p>"
    return head + ("<table><tr><th>assignment</th><th>hand-ins</th><th>shared fingerprints</th><th>shared tokens</th>"
                   "<th>shared lines</th></tr>" + "".join(rows) + "</table>")


def write_report(graded: Path, out: Path | None = None) -> Path:
    """Write report.html and report.json for GRADED_DIR (into GRADED_DIR/report/ unless `out`); returns the page."""
    results = json.loads((graded / "results.json").read_text(encoding="utf-8"))
    data = analyse(results)
    out = out or graded / "report"
    out.mkdir(parents=True, exist_ok=True)
    write_whole(out / "report.json", json.dumps(data, indent=1, ensure_ascii=False))
    page = out / "report.html"
    write_whole(page, render(data))
    return page
