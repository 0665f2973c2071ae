#!/usr/bin/env python
"""Run the course's notebooks on a GPU machine and keep what they measured (issues 14.5 and 37).

    python scripts/gpu_check.py                  # the short check: within 8 minutes on one GPU, kernel starts included
    python scripts/gpu_check.py --full           # the full matrix: both copies of every notebook under every setting
    python scripts/gpu_check.py --only 06 07     # some notebooks
    python scripts/gpu_check.py --only 06 --compile --full  # also 06's opt-in torch.compile deep-dive

The short check (the default) runs, once each with every GPU visible, the solution notebooks that have a
GPU-dependent cell (a code cell that names cuda or nccl): 06 and 07 top to bottom, and the others that ask for a
GPU (00 and 02 today). Every cell runs, so every GPU cell of those notebooks does, under each notebook's own
defaults (06's torch.compile deep-dive stays off unless `--compile`). The full matrix (`--full`) runs every
notebook, the solution and the released copy with the reference answers filled in
(grader.author.mutants.reference_submission), under three settings:
  all   every GPU the machine has (CUDA_VISIBLE_DEVICES unset)
  one   one GPU (CUDA_VISIBLE_DEVICES=0); on a machine with one GPU this is `all` again and is not rerun
  none  no GPU (CUDA_VISIBLE_DEVICES= empty): the CPU paths, as on a laptop
Each notebook runs with nbclient in a fresh kernel in an empty folder, in a child process of its own.

As each run ends, its row (ran / the first failing cell, seconds, and the seconds the CPU path took) is printed
and appended to the table file, by default benchmarks/gpu-<device>-<date>.md (without a GPU: cpu-<date>.md in
--out), so a check cut off at its limit still leaves its rows. At the end come the key GPU figures read from the
executed notebooks' own outputs: the precision table's rows (with the TF32 rows), the backend the DDP demos used
and ddp_train's largest difference from one process, and FSDP's bytes per rank ("not found" where the line is not
there). Nothing here re-implements a notebook: the numbers are the notebooks' own.

Sizing. No GPU has run this yet, so a run's expected time is what the same run took on the CPU path of this
project's 2-core machine (CPU_SECONDS, measured with this script; every run without a GPU prints its own times
beside them). 06 and 07 load the GPU and run one at a time (the heavy lane), so their timings are their own;
the others share the remaining lanes, longest first. The plan's estimate is the longer of the heavy lane and the
busiest other lane, and the short plan must fit in HEADROOM of the limit: the rest is left for what the CPU path
does not do (CUDA's start in every kernel and rank, the GPU-only cells). Whatever the estimate, no run starts
that is expected to end after the limit, and a running one is stopped there, so the check ends within it.

Without CUDA it says so and runs the `none` setting only. Exit status 1 when a run failed, ran out of time or
did not run. Executed notebooks and results.json are kept in --out (default build/gpu-check/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SETTINGS = {"all": None, "one": "0", "none": ""}  # CUDA_VISIBLE_DEVICES per setting (None: unset)
HEAVY = ("06_", "07_")  # the notebooks that load the GPU: run one at a time, so their timings are their own
LIMIT_S = 480.0  # the short check, from its start to its table: 8 minutes of a 15-minute GPU slot
FULL_LIMIT_S = 1800.0  # the full matrix
HEADROOM = 0.5  # the short plan's CPU-path estimate may use this share of LIMIT_S; the rest is for the GPU's own work
FINISH_S = 15.0  # kept back from the limit for reading the figures and writing the table
CELL_TIMEOUT_S = 120  # notebook cells take seconds; this bounds a stuck one
COMPILE_CELL_TIMEOUT_S = 600  # with --compile: 06's deep-dive compiles several models cold (145 s seen on one GPU host)
GPU_CELL = re.compile(r"\bcuda\b|\bnccl\b", re.I)
# Seconds per run (child process, kernel start and every cell) on the CPU path of this project's 2-core machine,
# measured with `python scripts/gpu_check.py --only 0` (the solution copies, two runs at a time; issue 37).
CPU_SECONDS = {"00_setup": 12.0, "01_gradient_descent": 13.0, "02_autograd_graph": 10.0, "03_minibatch_noise": 11.0,
               "04_custom_function": 9.0, "05_training_step": 11.0, "06_mixed_precision": 14.0, "07_distributed": 17.0}


@dataclass(frozen=True)
class Planned:
    """One run of the plan: a copy of a notebook under a setting."""

    kind: str  # "solution" or "released"
    name: str  # "06_mixed_precision"
    setting: str

    @property
    def heavy(self) -> bool:
        return self.name.startswith(HEAVY)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass
class Run:
    """One notebook under one setting, as it ended."""

    notebook: str  # "solution 06_mixed_precision" or "released 06_mixed_precision"
    setting: str
    status: str = "not run"  # ran | failed | timeout | crashed | not run
    first_failure: str = ""
    seconds: float = 0.0
    expected: float = 0.0  # the CPU path's seconds for the same notebook (CPU_SECONDS)
    executed: str = ""  # path of the executed notebook


def probe_gpus() -> tuple[int, str]:
    """How many CUDA devices torch sees here and the first one's name (asked in a child process, so this one never
    touches CUDA)."""
    probe = ("import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
             "print(n); print(torch.cuda.get_device_name(0) if n else 'cpu')")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
        count, name = out.stdout.strip().splitlines()[-2:]
        return int(count), name
    except (subprocess.SubprocessError, ValueError):
        return 0, "cpu"


def gpu_dependent(name: str) -> bool:
    """True when a code cell of the solution notebook names cuda or nccl: what it prints depends on a GPU."""
    import nbformat

    from grader.course import assignment_named

    nb = nbformat.read(assignment_named(name).source, as_version=4)
    return any(cell.cell_type == "code" and GPU_CELL.search(cell.source) for cell in nb.cells)


def plan(gpus: int, *, full: bool = False, only: Sequence[str] = (), settings: Sequence[str] = ()) -> list[Planned]:
    """The runs, in the order they start: the short check (solution copies of the GPU-dependent notebooks, or of
    `only`, every GPU visible) or the full matrix (`full`: both copies of every notebook under every setting)."""
    from grader.course import assignments

    names = [a.name for a in assignments()]
    if only:
        names = [n for n in names if any(n.startswith(o) for o in only)]
    elif not full:
        names = [n for n in names if gpu_dependent(n)]
    chosen = list(settings or (SETTINGS if full else ["all"]))
    if gpus == 0:
        chosen = ["none"]
    elif gpus == 1 and "one" in chosen and "all" in chosen:
        chosen.remove("one")
    kinds = ("solution", "released") if full else ("solution",)
    runs = [Planned(kind, name, setting) for setting in chosen for kind in kinds for name in names]
    # the heavy lane in course order; the other lanes take the longest run first (the estimate assumes this order)
    return sorted(runs, key=lambda r: (not r.heavy, -expected(r.name) if not r.heavy else 0))


def expected(name: str, seconds: Mapping[str, float] | None = None) -> float:
    """A run's expected seconds: the CPU path's (CPU_SECONDS), or the longest there for a notebook not measured."""
    seconds = CPU_SECONDS if seconds is None else seconds
    return seconds.get(name, max(seconds.values(), default=0.0))


def estimate(runs: Sequence[Planned], jobs: int, seconds: Mapping[str, float] | None = None) -> tuple[float, float, float]:
    """(heavy lane, busiest other lane, the plan's wall estimate) in seconds: the heavy runs one after another; the
    others over `jobs` lanes, each run to the lane that frees first, longest first (as `main` schedules them)."""
    heavy = sum(expected(r.name, seconds) for r in runs if r.heavy)
    lanes = [0.0] * max(jobs, 1)
    for cost in sorted((expected(r.name, seconds) for r in runs if not r.heavy), reverse=True):
        lanes[lanes.index(min(lanes))] += cost
    return heavy, max(lanes), max(heavy, max(lanes))


def default_jobs() -> int:
    """Lanes beside the heavy one: a quarter of the cores (a notebook's kernel and its forked ranks use several)."""
    return max(1, min(4, (os.cpu_count() or 2) // 4))


def materialise(kind: str, name: str, folder: Path) -> Path:
    """Write the notebook to run into `folder` (alone, as on a hosted kernel); returns its path."""
    import nbformat

    from grader.author.mutants import reference_submission
    from grader.course import assignment_named

    assignment = assignment_named(name)
    nb = (nbformat.read(assignment.source, as_version=4) if kind == "solution"
          else reference_submission(assignment))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / assignment.notebook
    nbformat.write(nb, path)
    return path


def kernel_env(setting: str) -> dict[str, str]:
    """The kernel's environment for `setting`: the GPUs it may see, and this checkout's helpers importable."""
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if SETTINGS[setting] is not None:
        env["CUDA_VISIBLE_DEVICES"] = SETTINGS[setting]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def cell_timeout() -> int:
    """Seconds a cell may take: longer when 06's compile deep-dive is switched on (TML_COMPILE=1, set by --compile)."""
    return COMPILE_CELL_TIMEOUT_S if os.environ.get("TML_COMPILE") == "1" else CELL_TIMEOUT_S


def execute_one(path: Path, setting: str, out: Path) -> dict:
    """Child process: run one notebook with nbclient; write the executed copy to `out`; return the result."""
    import nbformat

    from labkit.runner import NotebookRunner

    nb = nbformat.read(path, as_version=4)
    crashed = ""
    try:
        NotebookRunner(nb, timeout=cell_timeout(), kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute(env=kernel_env(setting))
    except Exception as exc:  # the kernel died, a cell timed out: say which and keep what ran
        crashed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    nbformat.write(nb, out)
    first = ""
    for index, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if cell.cell_type == "code" and errors:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
            first = (f"cell {index} ({grade_id}): {errors[0].ename}: "
                     f"{errors[0].evalue.splitlines()[0] if errors[0].evalue else ''}")
            break
    status = "crashed" if crashed else "failed" if first else "ran"
    return {"status": status, "first_failure": (first or crashed)[:200]}


# ---- figures read from the executed notebooks ------------------------------------------------------------

def stream_text(path: str | Path) -> dict[str, str]:
    """grade_id (or 'cell N') → the text a code cell printed."""
    import nbformat

    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return {}
    texts = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        key = cell.metadata.get("nbgrader", {}).get("grade_id") or f"cell {index}"
        texts[key] = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return texts


PRECISION_ROW = re.compile(r"^\s*(cpu|cuda(?::\d+)?)\s*\|\s*([^|]*?(?:fp32|bf16|fp16|TF32)[^|]*?)\s*\|(.*)$", re.M)


def figures_06(path: str | Path) -> list[str]:
    """The precision table's rows (device, setting, the rest of the row) and the bf16 and TF32 support lines."""
    text = "\n".join(stream_text(path).values())
    lines = []
    for line, what in ((r"^bf16 on .*$", "bf16 support line"), (r"^TF32 on .*$", "TF32 support line")):
        found = re.search(line, text, re.M)
        lines.append(found.group(0).strip() if found else f"{what}: not found")
    rows = PRECISION_ROW.findall(text)
    if not rows:
        return lines + ["precision table: not found"]
    for device, label, rest in rows:
        cells = [c.strip() for c in rest.split("|")]
        lines.append(f"{device:>7} | {label:<28} | " + " | ".join(cells))
    if not any("TF32" in label for _, label, _ in rows):
        lines.append("TF32 row: not found")
    return lines


def figures_07(path: str | Path) -> list[str]:
    """The DDP demos' backend, ddp_train's largest difference from one process, FSDP's bytes per rank."""
    text = "\n".join(stream_text(path).values())
    lines = []
    backend = re.search(r"the demos use (\w+) with (\d+) processes", text)
    lines.append(f"DDP demos: {backend.group(1)} with {backend.group(2)} processes" if backend
                 else "DDP demos' backend: not found")
    gpu = re.findall(r"rank (\d+) trained on (\S+) over (\w+): largest difference from one CPU process (\S+)", text)
    if gpu:
        lines += [f"ddp_train rank {r} on {where} over {b}: max |param diff| vs one process {d}" for r, where, b, d in gpu]
    else:
        skipped = re.search(r"^Skipped: ddp_train over nccl.*$", text, re.M)
        failed = re.search(r"^The GPU launch failed.*$", text, re.M)
        lines.append(f"ddp_train over nccl: {(skipped or failed).group(0)[:160]}" if (skipped or failed)
                     else "ddp_train over nccl: not found")
    launch = re.search(r"(\d+) parameters, fp32 Adam, (\w+)\.", text)
    totals = re.findall(r"total on rank 0, ([^:]+): (\d+) bytes", text)
    if launch:
        lines.append(f"FSDP vs DDP: {launch.group(1)} parameters over {launch.group(2)}")
    rows = re.findall(r"^rank (\d+)\s+(params|grads|buckets|optimizer)\s+(.*)$", text, re.M)
    per_rank: dict[str, list[str]] = {}
    for rank, kind, rest in rows:
        per_rank.setdefault(rank, []).append(f"{kind} {rest.split()[-1]}")  # the last column is FSDP
    if per_rank:
        lines += [f"FSDP bytes on rank {r}: " + ", ".join(v) for r, v in sorted(per_rank.items())]
    lines += [f"total bytes on rank 0, {c}: {b}" for c, b in totals] or ["FSDP bytes per rank: not found"]
    diff = re.search(r"largest difference between FSDP's gathered parameters and DDP's after training: (\S+)", text)
    lines.append(f"FSDP vs DDP final parameters, max |diff|: {diff.group(1)}" if diff else
                 "FSDP vs DDP parameter difference: not found")
    return lines


def run_in_child(planned: Planned, work: Path, out: Path, deadline: float) -> Run:
    """Run one notebook in its own process (a kernel that hangs is killed with it), stopped at `deadline`; its seconds
    are the child's, from its start to its end (kernel start included)."""
    run = Run(planned.label, planned.setting, expected=expected(planned.name))
    left = deadline - time.monotonic()
    if left < run.expected:
        run.first_failure = f"expected {run.expected:.0f} s, {max(left, 0):.0f} s left before the limit"
        return run
    folder = work / planned.setting / f"{planned.kind}-{planned.name}"
    path = materialise(planned.kind, planned.name, folder)
    run.executed = str(out / planned.setting / f"{planned.kind}-{planned.name}.ipynb")
    Path(run.executed).parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--execute-one", str(path), planned.setting, run.executed]
    began = time.perf_counter()
    try:
        child = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=str(folder))
    except subprocess.TimeoutExpired:
        run.status, run.first_failure = "timeout", "stopped at the check's time limit"
        run.seconds = time.perf_counter() - began
        return run
    run.seconds = time.perf_counter() - began
    try:
        result = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else None
    except (ValueError, IndexError):
        result = None
    if result is None:
        run.status = "crashed"
        run.first_failure = (child.stderr.strip().splitlines() or ["no output"])[-1][:200]
    else:
        run.status, run.first_failure = result["status"], result["first_failure"]
    return run


# ---- the table -------------------------------------------------------------------------------------------

TABLE_HEAD = ("| notebook | setting | outcome | seconds | CPU path, s | first failure |\n"
              "| --- | --- | --- | ---: | ---: | --- |\n")


def outcome(run: Run) -> str:
    """ran / not run / the status and, for a failure, the first failing cell."""
    where = re.match(r"cell (\d+)", run.first_failure)
    return run.status + (f" @cell {where.group(1)}" if where and run.status != "ran" else "")


def table_row(run: Run) -> str:
    seconds = f"{run.seconds:.0f}" if run.status != "not run" else "-"
    failure = run.first_failure.replace("|", "\\|")
    return f"| {run.notebook} | {run.setting} | {outcome(run)} | {seconds} | {run.expected:.0f} | {failure} |"


class TableFile:
    """The markdown table, written as the check goes: a header, then each run's row the moment it ends."""

    def __init__(self, path: Path, header: str) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + "\n\n" + TABLE_HEAD, encoding="utf-8")

    def add(self, *lines: str) -> None:
        with self.path.open("a", encoding="utf-8") as table:
            table.write("".join(line + "\n" for line in lines))


def table_path(device: str, out: Path, gpus: int, today: datetime.date) -> Path:
    """benchmarks/gpu-<device>-<date>.md on a GPU machine (-2, -3 … for a later check that day), else
    <out>/cpu-<date>.md."""
    if not gpus:
        return out / f"cpu-{today.isoformat()}.md"
    stem = f"gpu-{re.sub(r'[^a-z0-9]+', '-', device.lower()).strip('-')}-{today.isoformat()}"
    path, n = REPO / "benchmarks" / f"{stem}.md", 1
    while path.exists():
        n += 1
        path = REPO / "benchmarks" / f"{stem}-{n}.md"
    return path


def sizing(runs: Sequence[Planned], jobs: int, limit: float, full: bool, seconds: Mapping[str, float],
           source: str) -> str:
    """The budget arithmetic in one line: each notebook's seconds from `source`, the lanes, the estimate against
    the limit (the short check: against HEADROOM of it)."""
    heavy, light, wall = estimate(runs, jobs, seconds)
    share = limit if full else HEADROOM * limit
    return (f"sizing from {source}: " + ", ".join(f"{name[:2]} {expected(name, seconds):.0f} s"
                                                  for name in dict.fromkeys(r.name for r in runs))
            + f"; heavy lane {heavy:.0f} s, busiest of {jobs} other lane(s) {light:.0f} s → estimate {wall:.0f} s, "
            f"{'within' if wall <= share else 'OVER'} {share:.0f} s"
            + ("" if full else f" ({HEADROOM:.0%} of the {limit:.0f} s limit; the rest is for CUDA's start and the "
                               "GPU-only cells)"))


def figures(runs: Sequence[Run], settings: Sequence[str]) -> list[str]:
    lines = ["Key GPU figures, read from the executed solution notebooks' outputs:"]
    for setting in settings:
        for prefix, reader in (("06_", figures_06), ("07_", figures_07)):
            run = next((r for r in runs if r.setting == setting and r.notebook.startswith(f"solution {prefix}")), None)
            if run is None:
                continue
            lines.append(f"[{setting}] {run.notebook}:")
            found = reader(run.executed) if run.executed and Path(run.executed).exists() else ["not run"]
            lines += ["    " + line for line in found]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the full matrix: both copies, every notebook and setting")
    parser.add_argument("--only", nargs="*", default=[], help="notebooks whose names start with these (e.g. 06 07)")
    parser.add_argument("--settings", nargs="*", choices=list(SETTINGS), help="default: all (short), every one (--full)")
    parser.add_argument("--jobs", type=int, default=0, help="lanes beside the heavy one (default: from the CPU count)")
    parser.add_argument("--limit", type=float, help=f"seconds the whole check may take (default {LIMIT_S:.0f}; "
                                                    f"{FULL_LIMIT_S:.0f} with --full)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu-check")
    parser.add_argument("--table", type=Path, help="the table file (default: see above)")
    parser.add_argument("--compile", action="store_true", help="switch on 06's torch.compile deep-dive (TML_COMPILE=1)")
    parser.add_argument("--execute-one", nargs=3, metavar=("NOTEBOOK", "SETTING", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.execute_one:
        path, setting, out = args.execute_one
        print(json.dumps(execute_one(Path(path), setting, Path(out))))
        return 0

    started = time.monotonic()
    limit = args.limit or (FULL_LIMIT_S if args.full else LIMIT_S)
    deadline = started + limit - FINISH_S
    os.environ["TML_COMPILE"] = "1" if args.compile else "0"  # every child and kernel inherits it
    import torch

    gpus, device = probe_gpus()
    jobs = args.jobs or default_jobs()
    todo = plan(gpus, full=args.full, only=args.only, settings=args.settings or ())
    settings = list(dict.fromkeys(r.setting for r in todo))
    header = [f"# GPU check, {datetime.date.today().isoformat()}: {device}" + (f" × {gpus}" if gpus else ""),
              "", f"torch {torch.__version__}, python {sys.version.split()[0]}, {os.cpu_count()} CPU cores; "
              f"CUDA devices visible: {gpus}",
              f"{'full matrix' if args.full else 'short check'}: {len(todo)} runs ({', '.join(settings)}); the heavy "
              f"lane ({', '.join(h.rstrip('_') for h in HEAVY)}) one at a time, {jobs} other lane(s); limit "
              f"{limit:.0f} s" + (", torch.compile deep-dive on" if args.compile else ""),
              sizing(todo, jobs, limit, args.full, CPU_SECONDS, "CPU_SECONDS")]
    if not gpus:
        header.insert(3, "No CUDA device is visible (torch.cuda.is_available() is False): the GPU paths cannot run "
                         "here. Running the 'none' setting only — the CPU paths, as on a laptop.")
    table = TableFile(args.table or table_path(device, args.out, gpus, datetime.date.today()), "\n".join(header))
    print("\n".join(header) + f"\ntable: {table.path}\n\n" + TABLE_HEAD, end="", flush=True)

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    runs: list[Run] = []
    lock = threading.Lock()

    def one(planned: Planned) -> Run:
        run = run_in_child(planned, work, args.out, deadline)
        with lock:
            runs.append(run)
            print(table_row(run), flush=True)
            table.add(table_row(run))
        return run

    heavy_lane = threading.Thread(target=lambda: [one(r) for r in todo if r.heavy])
    heavy_lane.start()
    with ThreadPoolExecutor(max_workers=jobs) as others:
        list(others.map(one, [r for r in todo if not r.heavy]))
    heavy_lane.join()

    closing = [""]
    if not gpus:  # the CPU path's own times, which CPU_SECONDS records: the same arithmetic on them
        measured = {r.notebook.split()[1]: r.seconds for r in runs if r.status == "ran"}
        closing += [sizing(todo, jobs, limit, args.full, measured, "this check's runs"), ""]
    closing += figures(runs, settings)
    bad = [r for r in runs if r.status != "ran"]
    closing += ["", f"{len(runs) - len(bad)} of {len(runs)} runs ran to the end; "
                    f"{time.monotonic() - started:.0f} s in all; executed notebooks in {args.out}"]
    print("\n".join(closing))
    table.add(*closing)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"gpus": gpus, "device": device, "torch": torch.__version__,
                                                       "runs": [asdict(r) for r in runs]}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
