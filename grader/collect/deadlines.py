"""Due dates, per-student extensions, the late penalty and the feedback mode: one TOML file.

`python -m grader autograde SUBMISSIONS --out graded/ --config grading.toml` reads it and checks it
before anything is graded (an unknown assignment or student, a malformed date, an unknown key: a
ConfigError naming the key). Every key is optional:

    timezone = "Europe/Berlin"        # for times written without an offset (default "UTC")
    feedback = "after-release"        # or "at-once" (grader/report/feedback.py); --feedback overrides it

    [due]                             # assignment -> due date; an assignment not listed has none
    01_gradient_descent = "2025-10-14 23:59"

    [late]
    grace_minutes = 15                # a hand-in at most this late counts as on time (default 0)
    per_day = 10                      # percent taken per started day late, counted from the due date (default 0)
    of = "earned"                     # the percent of the points "earned" (default) or of the "max"imum
    max_days = 7                      # later than this many days: every point is taken (default: no limit)

    [[extension]]                     # one table per extension
    student = "alice_1001"            # the student key, as grades.csv spells it
    assignment = "01_gradient_descent"  # omit it: every assignment with a due date
    due = "2025-10-16 23:59"          # a new due date … or
    days = 2                          # … days added to the assignment's due date

    [[override]]                      # a grade changed by hand (a regrade request, credit for an explained answer)
    student = "alice_1001"
    assignment = "01_gradient_descent"
    exercise = "mse_grad"             # a test cell of the assignment, as grades.csv's column
    points = 3                        # the exercise's points from now on (0 … its maximum)
    reason = "derivation explained in office hours"

A student is named by the key grades.csv uses, by the LMS user id alone (`1001`: the number collection
puts at the end of the keys of LMS-zip hand-ins), or by the folder name without that number (`alice`), so
one grading.toml serves a folder collection and an LMS zip of the same class; `autograde` prints each
name it had to match that way, and refuses a name that fits no student or more than one.

Overrides are applied after grading, on every run (a later run keeps them while they stay in the file);
the row's status says `regraded by hand: …`, results.json keeps the autograder's points beside them, and
the feedback page and the class report show them. Lateness is counted after the overrides: `settle` is
the one place a row's final points are decided, for the worker's feedback page and for grades.csv alike.

The hand-in time is Submission.submitted_at (nbgrader's timestamp.txt, or the LMS zip's member time; none
from a Moodle zip, whose member times are not hand-in times: README).
grades.csv gets `late_by` (hours after the due date in effect, extension included; 0 when on time;
empty when there is no due date or the hand-in time is unknown) and `penalty` (points taken); `total`
is the points after the penalty. A penalty never exceeds the points earned, so a total is never below 0.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import tomllib

from grader.results import Note, NoteKind, Result, points

FEEDBACK_MODES = ("after-release", "at-once")
DEFAULT_FEEDBACK = "after-release"
TOP_KEYS = {"timezone", "feedback", "due", "late", "extension", "override"}
LATE_KEYS = {"grace_minutes", "per_day", "of", "max_days"}
EXTENSION_KEYS = {"student", "assignment", "due", "days"}
OVERRIDE_KEYS = {"student", "assignment", "exercise", "points", "reason"}
LMS_ID = re.compile(r"_(\d+)$", re.ASCII)  # the LMS user id collection puts at the end of an LMS-zip hand-in's key
DATE_HELP = "write it as 2025-10-14 23:59 or 2025-10-14T23:59:00+02:00"


class ConfigError(ValueError):
    """The grading config is wrong; the message names the file, the key and what to write instead."""


class NoHandIn(ConfigError):
    """A name that matches no student who handed in: a typo, or a student who has not handed in yet."""


@dataclass(frozen=True)
class Extension:
    student: str
    assignment: str  # "" = every assignment
    due: datetime | None = None
    days: float = 0.0


@dataclass(frozen=True)
class Override:
    """An exercise's points set by hand; applied after grading on every run (`settle`)."""

    student: str
    assignment: str
    exercise: str
    points: float
    reason: str
    changed: bool = False  # the hand-in is not the one the override was given for (grader/collect/ledger.py)
    hand_in: str = ""  # "sha256:…" of the hand-in it was given for, pinned by the instructor ('' when not)


@dataclass(frozen=True)
class LatePolicy:
    grace_minutes: float = 0.0
    per_day: float = 0.0  # percent per started day late
    of: str = "earned"
    max_days: float | None = None


@dataclass(frozen=True)
class Config:
    """What a grading config says (the defaults when there is no file)."""

    source: str = ""  # the file it came from, for messages
    timezone: str = "UTC"
    feedback: str = DEFAULT_FEEDBACK
    due: dict[str, datetime] = field(default_factory=dict)
    late: LatePolicy = LatePolicy()
    extensions: tuple[Extension, ...] = ()
    overrides: tuple[Override, ...] = ()
    matched: tuple[str, ...] = ()  # names matched to a student key other than by equality (`check_students`)
    warnings: tuple[str, ...] = ()  # extensions for students with no hand-in (`check_students`)

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


@dataclass(frozen=True)
class Lateness:
    """One hand-in measured against its due date; travels to the worker in the Spec (as a dict)."""

    due: str = ""  # the due date in effect, ISO with offset ("" when the assignment has none)
    submitted: str = ""  # the hand-in time read, ISO with offset ("" when unknown)
    late_by: float | None = None  # hours after `due` (0 when on time); None when there is nothing to measure
    fraction: float = 0.0  # share of the base points taken
    of: str = "earned"  # the base: the points earned or the maximum
    note: str = ""  # one sentence for the student's page and the report ("" when on time or no due date)


# --- reading the file -------------------------------------------------------------------------------------

def _where(source: str, key: str) -> str:
    return f"{source}: {key}" if source else key


def _date(value: object, tz: ZoneInfo, where: str) -> datetime:
    """A due date from TOML (a string or a TOML datetime), made timezone-aware."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        raise ConfigError(f"{where} = {value}: a date needs a time too ({DATE_HELP})")
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConfigError(f"{where} = {value!r}: not a date and time ({DATE_HELP})") from None
        if len(value.strip()) <= 10:
            raise ConfigError(f"{where} = {value!r}: a date needs a time too ({DATE_HELP})")
    else:
        raise ConfigError(f"{where} = {value!r}: not a date and time ({DATE_HELP})")
    return moment if moment.tzinfo else moment.replace(tzinfo=tz)


def _number(value: object, where: str, low: float = 0.0, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        bound = f"between {low:g} and {high:g}" if high != math.inf else f"at least {low:g}"
        raise ConfigError(f"{where} = {value!r}: must be a number {bound}")
    return float(value) + 0.0  # -0.0 (TOML allows it) is 0


def _unknown(keys: object, allowed: set[str], where: str) -> None:
    extra = sorted(set(keys) - allowed) if isinstance(keys, dict) else []
    if extra:
        hint = difflib.get_close_matches(extra[0], sorted(allowed), n=1)
        raise ConfigError(f"{where}: unknown key {extra[0]!r}" + (f" (did you mean {hint[0]!r}?)" if hint else
                                                                 f" (known: {', '.join(sorted(allowed))})"))


def parse_config(text: str, assignments: list[str], source: str = "") -> Config:
    """A Config from TOML text; `assignments` are the course's assignment names (to catch typos)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source or 'config'}: not valid TOML: {err}") from None
    _unknown(raw, TOP_KEYS, source or "config")
    zone = raw.get("timezone", "UTC")
    try:
        tz = ZoneInfo(zone) if isinstance(zone, str) else None
    except (ZoneInfoNotFoundError, ValueError):
        tz = None
    if tz is None:
        raise ConfigError(f"{_where(source, 'timezone')} = {zone!r}: not a time zone (e.g. 'UTC', 'Europe/Berlin')")
    feedback = raw.get("feedback", DEFAULT_FEEDBACK)
    if feedback not in FEEDBACK_MODES:
        raise ConfigError(f"{_where(source, 'feedback')} = {feedback!r}: must be one of {', '.join(FEEDBACK_MODES)}")
    due_table = raw.get("due", {})
    if not isinstance(due_table, dict):
        raise ConfigError(f"{_where(source, '[due]')}: must be a table of assignment = date")
    due = {}
    for name, value in due_table.items():
        where = _where(source, f"[due] {name}")
        if name not in assignments:
            hint = difflib.get_close_matches(name, assignments, n=1)
            raise ConfigError(f"{where}: no such assignment" + (f" (did you mean {hint[0]}?)" if hint else
                                                                 f" (known: {', '.join(assignments)})"))
        due[name] = _date(value, tz, where)
    late_table = raw.get("late", {})
    if not isinstance(late_table, dict):
        raise ConfigError(f"{_where(source, '[late]')}: must be a table")
    _unknown(late_table, LATE_KEYS, _where(source, "[late]"))
    of = late_table.get("of", "earned")
    if of not in ("earned", "max"):
        raise ConfigError(f"{_where(source, '[late] of')} = {of!r}: must be 'earned' or 'max'")
    late = LatePolicy(
        grace_minutes=_number(late_table.get("grace_minutes", 0), _where(source, "[late] grace_minutes")),
        per_day=_number(late_table.get("per_day", 0), _where(source, "[late] per_day"), 0, 100),
        of=of,
        max_days=(_number(late_table["max_days"], _where(source, "[late] max_days"))
                  if "max_days" in late_table else None))
    extensions = []
    for where, entry in _tables(raw, "extension", EXTENSION_KEYS, source):
        student, assignment = entry.get("student"), entry.get("assignment", "")
        if not isinstance(student, str) or not student:
            raise ConfigError(f"{where}: needs student = \"<student key as in grades.csv>\"")
        where = f"{where} (student {student!r})"
        if assignment and assignment not in assignments:
            raise ConfigError(f"{where}: assignment {assignment!r}: no such assignment")
        if ("due" in entry) == ("days" in entry):
            raise ConfigError(f"{where}: give either due = \"<date>\" or days = <number>, "
                              f"not {'both' if 'due' in entry else 'neither'}")
        if "days" in entry and (assignment and assignment not in due or not due):
            raise ConfigError(f"{where}: days = {entry['days']!r} extends a due date, but "
                              + (f"{assignment} has none in [due]" if assignment else "[due] lists none"))
        extensions.append(Extension(
            student, assignment,
            due=_date(entry["due"], tz, f"{where} due") if "due" in entry else None,
            days=_number(entry["days"], f"{where} days") if "days" in entry else 0.0))
    return Config(source=source, timezone=zone, feedback=feedback, due=due, late=late, extensions=tuple(extensions),
                  overrides=_overrides(_tables(raw, "override", OVERRIDE_KEYS | {"hand_in"}, source), assignments))


def _tables(raw: dict, name: str, keys: set[str], source: str) -> list[tuple[str, dict]]:
    """The file's [[name]] tables, each with where it is (for messages), their keys checked."""
    entries = raw.get(name, [])
    if not isinstance(entries, list):
        raise ConfigError(f"{_where(source, name)}: write each {name} as an [[{name}]] table")
    found = []
    for index, entry in enumerate(entries, 1):
        where = _where(source, f"[[{name}]] {index}")
        _unknown(entry, keys, where)
        found.append((where, entry))
    return found


def _overrides(tables: list[tuple[str, dict]], assignments: list[str]) -> tuple[Override, ...]:
    """The [[override]] tables, each complete; the exercise and the points are checked against the class later."""
    found = []
    for where, entry in tables:
        missing = sorted(OVERRIDE_KEYS - set(entry))
        if missing:
            raise ConfigError(f"{where}: needs {missing[0]} = … (an override has {', '.join(sorted(OVERRIDE_KEYS))})")
        texts = {key: entry[key] for key in ("student", "assignment", "exercise", "reason")}
        empty = next((key for key, value in texts.items() if not isinstance(value, str) or not value.strip()), None)
        if empty:
            raise ConfigError(f"{where}: {empty} = {entry[empty]!r}: must be a non-empty string")
        if entry["assignment"] not in assignments:
            hint = difflib.get_close_matches(entry["assignment"], assignments, n=1)
            raise ConfigError(f"{where}: assignment {entry['assignment']!r}: no such assignment"
                              + (f" (did you mean {hint[0]}?)" if hint else f" (known: {', '.join(assignments)})"))
        pin = entry.get("hand_in", "")
        if pin and not (isinstance(pin, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", pin)):
            raise ConfigError(f"{where}: hand_in = {pin!r}: write the \"sha256:…\" autograde printed for the hand-in")
        found.append(Override(entry["student"], entry["assignment"], entry["exercise"],
                              _number(entry["points"], f"{where} points"), entry["reason"].strip(), hand_in=pin))
    return tuple(found)


def load_config(path: Path | None, assignments: list[str]) -> Config:
    """The config in `path` (the defaults when `path` is None)."""
    if path is None:
        return Config()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read it ({type(err).__name__}: {err})") from None
    return parse_config(text, assignments, str(path))


def _student_key(name: str, students: set[str], where: str) -> tuple[str, str]:
    """(the key of the one student `name` names, how it matched: '' when equal); ConfigError for none or two."""
    if name in students:
        return name, ""
    own = LMS_ID.sub("", name).lower()
    ways = [("by LMS id", [s for s in students if (m := LMS_ID.search(s)) and m.group(1) == name]),
            ("by name: the key without its LMS id", [s for s in students if LMS_ID.search(s) and
                                                     LMS_ID.sub("", s).lower() == name.lower()]),
            ("by name: the folder name", [s for s in students if LMS_ID.search(name) and s.lower() == own])]
    for how, found in ways:
        if len(found) > 1:
            raise ConfigError(f"{where}: student {name!r} could be {' or '.join(sorted(found))} ({how}): "
                              "name one by its key as grades.csv spells it")
        if found:
            return found[0], how
    hint = difflib.get_close_matches(name, sorted(students), n=1)
    raise NoHandIn(f"{where}: student {name!r} handed nothing in and is not in the class"
                   + (f" (did you mean {hint[0]!r}?)" if hint else ""))


def check_students(config: Config, students: set[str], exercises: dict[str, dict[str, float]] | None = None) -> Config:
    """`config` with every student named by their key, once it is shown to fit the class; else ConfigError.

    Each override must name exactly one student (by key, LMS id or folder name: `_student_key`); with `exercises`
    (assignment → test cell or written answer → its points), it must name one of the assignment's exercises or
    written answers and give it between 0 and its points. An extension may also name a student who has not handed
    in yet (granted before the deadline, as most are): kept as written, with a line in `warnings` in case the name
    is a typo. `matched` says which names were matched other than by key.
    """
    matched: list[str] = []
    warnings: list[str] = []

    def key(name: str, where: str) -> str:
        found, how = _student_key(name, students, where)
        if how:
            matched.append(f"{where}: student {name!r} is {found} ({how})")
        return found

    def extension_key(name: str, where: str) -> str:
        try:
            return key(name, where)
        except NoHandIn as err:
            warnings.append(f"warning: {err}: the extension waits for their hand-in (if they did hand in, fix the name)")
            return name

    extensions = tuple(replace(ext, student=extension_key(ext.student, _where(config.source, f"[[extension]] {index}")))
                       for index, ext in enumerate(config.extensions, 1))
    overrides: list[Override] = []
    seen: dict[tuple[str, str, str], int] = {}
    for index, o in enumerate(config.overrides, 1):
        where = _where(config.source, f"[[override]] {index}")
        o = replace(o, student=key(o.student, where))
        top = (exercises or {}).get(o.assignment)
        if top is not None and o.exercise not in top:
            hint = difflib.get_close_matches(o.exercise, list(top), n=1)
            raise ConfigError(f"{where}: exercise {o.exercise!r}: {o.assignment} has no such exercise"
                              + (f" (did you mean {hint[0]!r}?)" if hint else f" (it has {', '.join(top)})"))
        if top is not None and o.points > top[o.exercise]:
            raise ConfigError(f"{where}: points = {o.points:g}: {o.exercise} is worth {top[o.exercise]:g} at most")
        same = (o.student, o.assignment, o.exercise)
        if same in seen:
            raise ConfigError(f"{where}: {o.student}'s {o.exercise} in {o.assignment} is overridden already by "
                              f"[[override]] {seen[same]}: keep one")
        seen[same] = index
        overrides.append(o)
    return replace(config, extensions=extensions, overrides=tuple(overrides), matched=tuple(matched),
                   warnings=tuple(warnings))


def overrides_for(config: Config, student: str, assignment: str) -> list[Override]:
    return [o for o in config.overrides if (o.student, o.assignment) == (student, assignment)]


# --- measuring a hand-in ----------------------------------------------------------------------------------

def parse_time(text: str, tz: ZoneInfo) -> datetime | None:
    """A hand-in time: ISO 8601 (offset or 'Z' optional), or nbgrader's '<date> <time> <zone name>'."""
    text = text.strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        head, _, zone = text.rpartition(" ")
        try:
            moment = datetime.fromisoformat(head).replace(tzinfo=ZoneInfo(zone))
        except (ValueError, ZoneInfoNotFoundError):
            return None
    return moment if moment.tzinfo else moment.replace(tzinfo=tz)


def due_for(config: Config, student: str, assignment: str) -> datetime | None:
    """The due date in effect for one student: the assignment's, moved by the student's extension."""
    due = config.due.get(assignment)
    for ext in config.extensions:
        if ext.student == student and ext.assignment in ("", assignment):
            if ext.due is not None:
                due = ext.due
            elif due is not None:
                due = due + timedelta(days=ext.days)
    return due


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def lateness(config: Config, student: str, assignment: str, submitted_at: str) -> Lateness:
    """How late one hand-in is and what share of its points the policy takes."""
    due = due_for(config, student, assignment)
    if due is None:
        return Lateness()
    policy = config.late
    moment = parse_time(submitted_at, config.tz)
    if moment is None:
        what = "unreadable" if submitted_at.strip() else "unknown"
        return Lateness(due=_iso(due), of=policy.of,
                        note=f"hand-in time {what}: not checked against the due date {_iso(due)}")
    seconds = (moment - due).total_seconds()
    hours = round(max(0.0, seconds) / 3600, 2)
    base = Lateness(due=_iso(due), submitted=_iso(moment), late_by=hours, of=policy.of)
    if seconds <= 0:
        return base
    if seconds <= policy.grace_minutes * 60:
        return replace(base, note=(f"handed in {hours:g} h after the due date {_iso(due)}, "
                                   f"within the {policy.grace_minutes:g}-minute grace period"))
    days = math.ceil(seconds / 86400)
    if policy.max_days is not None and seconds > policy.max_days * 86400:
        fraction, why = 1.0, f"more than {policy.max_days:g} days late: no points"
    else:
        fraction = min(1.0, policy.per_day * days / 100)
        why = (f"{days} started day{'s' if days > 1 else ''} late × {policy.per_day:g} % = "
               f"{100 * fraction:g} % of the {'points earned' if policy.of == 'earned' else 'maximum points'} taken")
    return replace(base, fraction=fraction, note=f"handed in {hours:g} h after the due date {_iso(due)}: {why}")


def settle(result: Result, late: Lateness | dict, overrides: Sequence[Override | dict] = ()) -> Result:
    """Decide a graded row's final points, in place: the overrides replace the autograder's points, then the
    late policy takes its share (`penalty`). The one place this is done; settling a row again gives the same row."""
    for exercise, was in result.overrides.items():  # back to the autograder's points first
        if exercise in result.by_hand_max:
            result.by_hand[exercise] = was["graded"]
        else:
            result.scores[exercise] = was["graded"]
    result.overrides = {}
    result.status = [note for note in result.status
                     if note.kind not in (NoteKind.REGRADED, NoteKind.BY_HAND, NoteKind.OVERRIDE_CHANGED)]
    for entry in overrides:
        o = entry if isinstance(entry, Override) else Override(**entry)
        if o.changed:
            result.status.append(Note(NoteKind.OVERRIDE_CHANGED, f"hand-in changed since {o.exercise} was regraded by "
                                      "hand: check the override still holds (edit its reason to confirm it, or pin "
                                      "hand_in to the hand-in you read)"))
        if o.exercise in result.by_hand_max:  # a written answer: graded by hand, apart from the tests
            result.overrides[o.exercise] = {"graded": result.by_hand.get(o.exercise), "points": o.points,
                                            "reason": o.reason}
            result.by_hand[o.exercise] = o.points
            continue
        if o.exercise not in result.max_scores:  # a row nothing was graded for (an unknown assignment)
            continue
        graded = result.scores.get(o.exercise, 0.0)
        result.overrides[o.exercise] = {"graded": graded, "points": o.points, "reason": o.reason}
        result.scores[o.exercise] = o.points
        result.status.append(Note(NoteKind.REGRADED, f"regraded by hand: {o.exercise} {points(graded)} → "
                                                     f"{points(o.points)} of {points(result.max_scores[o.exercise])} "
                                                     f"({o.reason})"))
    waiting = [written for written, given in result.by_hand.items() if given is None]
    if waiting:
        result.status.append(Note(NoteKind.BY_HAND, f"written answer waiting for a hand grade: {', '.join(waiting)} "
                                                    "([[override]] in grading.toml)"))
    late = Lateness(**late) if isinstance(late, dict) else late
    result.lateness = asdict(late) if late.due else {}
    # a written answer graded by hand is as late as the rest; one nobody graded changes no penalty
    by_hand = [w for w in result.by_hand_max if w in result.overrides]
    result.penalty = penalty(sum(result.scores.values()) + sum(result.by_hand[w] or 0.0 for w in by_hand),
                             sum(result.max_scores.values()) + sum(result.by_hand_max[w] for w in by_hand), late)
    return result


def penalty(points: float, max_points: float, late: Lateness | dict) -> float:
    """Points the policy takes from `points` (never more than `points`), rounded to 0.01."""
    if isinstance(late, dict):
        late = Lateness(**late)
    base = points if late.of == "earned" else max_points
    return round(min(points, base * late.fraction), 2)
