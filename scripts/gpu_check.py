#!/usr/bin/env python
"""Run the course itself on a GPU machine: every notebook, top to bottom, three ways (issue 14 item 5).

    python scripts/gpu_check.py                  # everything, within about 12 minutes
    python scripts/gpu_check.py --only 06 07     # some notebooks
    python scripts/gpu_check.py --settings none  # one setting
    python scripts/gpu_check.py --only 06 --compile --budget 1500  # also 06's opt-in torch.compile deep-dive

It executes every solution notebook, and every released notebook with the reference answers filled in
(grader.author.mutants.reference_submission), with nbclient, each in a fresh kernel in an empty folder, under three
settings:
  all   every GPU the machine has (CUDA_VISIBLE_DEVICES unset)
  one   one GPU (CUDA_VISIBLE_DEVICES=0); on a machine with one GPU this is `all` again and is not rerun
  none  no GPU (CUDA_VISIBLE_DEVICES= empty): the CPU paths, as on a laptop
and prints one table, notebook × setting → ran / the first failing cell / seconds, then the key GPU figures
read from the executed notebooks' own outputs: the precision table's rows (with the TF32 rows), the
backend the DDP demos used and ddp_train's largest difference from one process, and FSDP's bytes per rank.
A figure whose output line is not there (a skipped cell, a changed notebook) is reported as "not found".
06's torch.compile deep-dive is opt-in (TML_COMPILE=1) and stays off here unless `--compile` switches it on; its
cold compiles take minutes on a GPU host, so that run gives every cell COMPILE_CELL_TIMEOUT_S instead of CELL_TIMEOUT_S.

Without CUDA it says so, runs the `none` setting only, and exits 0 when every notebook ran. Exit status 1
when a notebook failed or ran out of time. Executed notebooks and results.json are kept in --out
(default build/gpu-check/). Nothing here re-implements a notebook: the numbers are the notebooks' own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SETTINGS = {"all": None, "one": "0", "none": ""}  # CUDA_VISIBLE_DEVICES per setting (None: unset)
HEAVY = ("06_", "07_")  # the notebooks that load the GPU: run one at a time, so their timings are their own
BUDGET_S = 690.0  # runs not started by then are reported as not run, so the whole check ends within 12 minutes
CELL_TIMEOUT_S = 120  # notebook cells take seconds; this bounds a stuck one
COMPILE_CELL_TIMEOUT_S = 600  # with --compile: 06's deep-dive compiles several models cold (145 s seen on one GPU host)


@dataclass
class Run:
    """One notebook under one setting."""

    notebook: str  # "solution 06_mixed_precision" or "released 06_mixed_precision"
    setting: str
    status: str = "not run"  # ran | failed | timeout | crashed | not run
    first_failure: str = ""
    seconds: float = 0.0
    executed: str = ""  # path of the executed notebook


def visible_gpus() -> int:
    """How many CUDA devices torch sees here (asked in a child process, so this one never touches CUDA)."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def notebooks(only: list[str]) -> list[tuple[str, str]]:
    """(kind, assignment name) for every notebook to run, solutions first."""
    from grader.course import assignments

    chosen = [a.name for a in assignments() if not only or any(a.name.startswith(o) for o in only)]
    return [("solution", n) for n in chosen] + [("released", n) for n in chosen]


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
    began = time.perf_counter()
    crashed = ""
    try:
        NotebookRunner(nb, timeout=cell_timeout(), kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute(env=kernel_env(setting))
    except Exception as exc:  # the kernel died, a cell timed out: say which and keep what ran
        crashed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    seconds = time.perf_counter() - began
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
    return {"status": status, "first_failure": (first or crashed)[:200], "seconds": round(seconds, 1)}


def run_in_child(run: Run, kind: str, name: str, work: Path, out: Path, deadline: float) -> Run:
    """Run one notebook in its own process (a kernel that hangs is killed with it)."""
    left = deadline - time.monotonic()
    if left <= 0:
        run.status, run.first_failure = "not run", "time budget used up"
        return run
    folder = work / run.setting / f"{kind}-{name}"
    path = materialise(kind, name, folder)
    run.executed = str(out / run.setting / f"{kind}-{name}.ipynb")
    Path(run.executed).parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--execute-one", str(path), run.setting, run.executed]
    began = time.perf_counter()
    try:
        child = subprocess.run(cmd, capture_output=True, text=True, timeout=max(left, 30), cwd=str(folder))
        result = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else None
    except subprocess.TimeoutExpired:
        run.status, run.first_failure, run.seconds = "timeout", "the time budget ran out", time.perf_counter() - began
        return run
    except (ValueError, IndexError):
        result = None
    if result is None:
        run.status, run.seconds = "crashed", time.perf_counter() - began
        run.first_failure = (child.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return run
    run.status, run.first_failure, run.seconds = result["status"], result["first_failure"], result["seconds"]
    return run


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


# ---- the table -------------------------------------------------------------------------------------------

def cell_text(run: Run | None) -> str:
    if run is None:
        return "-"
    if run.status == "ran":
        return f"ran {run.seconds:.0f} s"
    if run.status == "not run":
        return "not run"
    where = re.match(r"cell (\d+)", run.first_failure)
    return f"{run.status}" + (f" @cell {where.group(1)}" if where else "") + f" {run.seconds:.0f} s"


def print_table(runs: list[Run], settings: list[str]) -> None:
    names = list(dict.fromkeys(r.notebook for r in runs))
    by = {(r.notebook, r.setting): r for r in runs}
    width = max(len(n) for n in names) + 2
    print("\n" + "notebook".ljust(width) + "".join(s.ljust(22) for s in settings))
    for name in names:
        print(name.ljust(width) + "".join(cell_text(by.get((name, s))).ljust(22) for s in settings))
    failures = [r for r in runs if r.status not in ("ran",)]
    for r in failures:
        print(f"  {r.notebook} [{r.setting}]: {r.status}: {r.first_failure}")


def print_figures(runs: list[Run], settings: list[str]) -> None:
    print("\nKey GPU figures, read from the executed solution notebooks' outputs:")
    for setting in settings:
        for prefix, reader in (("06_", figures_06), ("07_", figures_07)):
            run = next((r for r in runs if r.setting == setting and r.notebook.startswith(f"solution {prefix}")), None)
            if run is None:
                continue
            print(f"[{setting}] {run.notebook}:")
            for line in (reader(run.executed) if run.executed and Path(run.executed).exists() else ["not run"]):
                print("    " + line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=[], help="notebooks whose names start with these (e.g. 06 07)")
    parser.add_argument("--settings", nargs="*", choices=list(SETTINGS), help="default: all three where there is a GPU")
    parser.add_argument("--jobs", type=int, default=0, help="notebooks run side by side (default: from the CPU count)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which no new run starts")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu-check")
    parser.add_argument("--compile", action="store_true", help="switch on 06's torch.compile deep-dive (TML_COMPILE=1)")
    parser.add_argument("--execute-one", nargs=3, metavar=("NOTEBOOK", "SETTING", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.execute_one:
        path, setting, out = args.execute_one
        print(json.dumps(execute_one(Path(path), setting, Path(out))))
        return 0

    started = time.monotonic()
    deadline = started + args.budget
    os.environ["TML_COMPILE"] = "1" if args.compile else "0"  # every child and kernel inherits it
    import torch

    gpus = visible_gpus()
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {os.cpu_count()} CPU cores; "
          f"CUDA devices visible: {gpus}")
    settings = list(args.settings or SETTINGS)
    if gpus == 0:
        print("No CUDA device is visible (torch.cuda.is_available() is False): the GPU paths cannot run here. "
              "Running the 'none' setting only — the CPU paths, as on a laptop.")
        settings = ["none"]
    elif gpus == 1 and "one" in settings and "all" in settings:
        settings.remove("one")
        print("One GPU: the 'one' setting (CUDA_VISIBLE_DEVICES=0) is the 'all' setting here; it runs once, as 'all'.")
    jobs = args.jobs or max(1, min(4, (os.cpu_count() or 2) // 4))
    todo = [(kind, name, s) for s in settings for kind, name in notebooks(args.only)]
    print(f"{len(todo)} runs ({len(todo) // max(len(settings), 1)} notebooks × {', '.join(settings)}); "
          f"{jobs} side by side, the GPU-heavy ones ({', '.join(h.rstrip('_') for h in HEAVY)}) one at a time; "
          f"no new run after {args.budget:.0f} s", flush=True)

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    lock = threading.Lock()
    heavy_lane = threading.Lock()

    def one(item: tuple[str, str, str]) -> Run:
        kind, name, setting = item
        run = Run(f"{kind} {name}", setting)
        if name.startswith(HEAVY):
            with heavy_lane:
                run = run_in_child(run, kind, name, work, args.out, deadline)
        else:
            run = run_in_child(run, kind, name, work, args.out, deadline)
        with lock:
            runs.append(run)
            print(f"  [{time.monotonic() - started:5.0f} s] {run.notebook} [{setting}]: {cell_text(run)}"
                  + (f" — {run.first_failure}" if run.first_failure else ""), flush=True)
        return run

    # heavy notebooks first: they are the longest, and the lane is serial
    ordered = sorted(todo, key=lambda t: (not t[1].startswith(HEAVY), settings.index(t[2])))
    with ThreadPoolExecutor(max_workers=jobs + 1) as pool:
        list(pool.map(one, ordered))
    order = {(f"{k} {n}", s): i for i, (k, n, s) in enumerate(todo)}
    runs.sort(key=lambda r: order[(r.notebook, r.setting)])
    print_table(runs, settings)

    print_figures(runs, settings)
    (args.out / "results.json").write_text(json.dumps({"gpus": gpus, "torch": torch.__version__,
                                                       "runs": [asdict(r) for r in runs]}, indent=1))
    bad = [r for r in runs if r.status != "ran"]
    print(f"\n{len(runs) - len(bad)} of {len(runs)} runs ran to the end; {time.monotonic() - started:.0f} s in all; "
          f"executed notebooks in {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
