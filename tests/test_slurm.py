"""The Slurm recipe of docs/instructor/clusters.md on a real scheduler (issue 22 item 6): a one-node Slurm (Debian's
slurm-wlm 22.05: slurmctld and slurmd on localhost, munge for authentication) runs the job array and the merge exactly
as the page writes them (two shards instead of eight, one CPU each, folders under a temporary /shared), and the merge
equals one run byte for byte.

Skips, saying why, where Slurm is not installed and cannot be (not root, no apt-get); under CI=true it fails instead.
The daemons run from a private folder (their own config, ports, state, munge key and socket) and are stopped after.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, autograde
from instructor_class import ONE, A

from grader.author.mutants import blank_submission, load_mutants, mutant_submission, reference_submission
from grader.author.selftest import put
from grader.batch.shards import shard_of

PACKAGES = ["slurmd", "slurmctld", "slurm-client", "munge"]
PROGRAMS = ["slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "munged"]


def require_slurm() -> None:
    """Install Debian's Slurm (8 packages, about half a minute) where it is missing and we may; else skip or fail."""
    if all(shutil.which(p) for p in PROGRAMS):
        return
    why = ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        why = "Slurm is not installed and this is not root with apt-get (apt-get install slurmd slurmctld slurm-client munge)"
    else:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
        done = subprocess.run(install, capture_output=True, text=True, env=env)
        if done.returncode:  # package lists missing or stale
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env)
            done = subprocess.run(install, capture_output=True, text=True, env=env)
        if done.returncode or not all(shutil.which(p) for p in PROGRAMS):
            why = f"could not install Slurm: {done.stderr.strip()[-300:]}"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


class OneNodeSlurm:
    """slurmctld + slurmd on localhost with munge, from a private folder: the recipe the page tells."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.processes: list[subprocess.Popen] = []
        for sub in ("state", "spool", "munge"):
            (folder / sub).mkdir(parents=True)
        (folder / "munge").chmod(0o700)
        key = folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = folder / "munge" / "munge.socket.2"
        self.conf = folder / "slurm.conf"
        self.conf.write_text(f"""
ClusterName=tml
SlurmctldHost=localhost
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
SlurmUser=root
StateSaveLocation={folder / 'state'}
SlurmdSpoolDir={folder / 'spool'}
SlurmctldPidFile={folder / 'slurmctld.pid'}
SlurmdPidFile={folder / 'slurmd.pid'}
SlurmctldLogFile={folder / 'slurmctld.log'}
SlurmdLogFile={folder / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
NodeName=localhost CPUs={os.cpu_count()} RealMemory={memory_mb()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        munge = self.folder / "munge"
        self._spawn(["munged", "-F", "--force", f"--socket={self.socket}", f"--key-file={munge / 'munge.key'}",
                     f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}",
                     f"--log-file={munge / 'munged.log'}"], "munged")
        self._wait(lambda: self.socket.exists(), "munged's socket")
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", "localhost"], "slurmd")
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", "the node to be idle")

    def _spawn(self, argv: list[str], name: str) -> None:
        log = open(self.folder / f"{name}.out", "w")
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env))

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                logs = {p.name: p.read_text()[-1500:] for p in self.folder.glob("*.out")}
                raise AssertionError(f"waited in vain for {what}: {logs}")
            time.sleep(0.5)

    def run(self, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, cwd=cwd, timeout=120)

    def job_state(self, job: str) -> set[str]:
        shown = self.run("scontrol", "show", "job", job, "-o").stdout
        return set(re.findall(r"JobState=(\S+)", shown))

    def stop(self) -> None:
        for process in reversed(self.processes):  # slurmd, slurmctld, munged: only what this test started
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def page_recipe(shared: Path) -> tuple[str, str]:
    """The page's job script and submit commands, on `shared`, with two shards of one CPU each."""
    text = (REPO / "docs/instructor/clusters.md").read_text()
    section = text[text.index("A Slurm job array"):]
    script, commands = re.findall(r"```bash\n(.*?)```", section, re.S)[:2]
    assert "#SBATCH --array=1-8" in script and "--cpus-per-task=2" in script and "sbatch --parsable grade.sh" in commands

    def here(block: str) -> str:
        return block.replace("/shared", str(shared)).replace("--array=1-8", "--array=1-2").replace(
            "--cpus-per-task=2", "--cpus-per-task=1")
    return here(script), here(commands)


def a_class(root: Path) -> None:
    """Four students, both shards of two non-empty."""
    mutants = {m.name: m for m in load_mutants(A)}
    hand_ins = {"ref-a_1": reference_submission(A), "blank_3": blank_submission(A),
                "factor2_4": mutant_submission(A, [mutants["mse_grad_missing_factor_2"]]),
                "ascends_5": mutant_submission(A, [mutants["gradient_descent_ascends"]])}
    assert sorted({shard_of(s, 2) for s in hand_ins}) == [1, 2]
    for student, nb in hand_ins.items():
        put(root, student, A, nb)


@pytest.mark.slow
def test_the_pages_job_array_and_merge_on_a_one_node_slurm_equal_one_run(tmp_path):
    require_slurm()
    shared = tmp_path / "shared"
    a_class(shared / "submissions")
    (shared / "grading.toml").write_text(f'feedback = "at-once"\n[due]\n{ONE} = "2030-01-15 23:59"\n')
    script, commands = page_recipe(shared)
    (REPO / "build").mkdir(exist_ok=True)
    job_script = Path(REPO / "build" / f"grade-{os.getpid()}.sh")  # sbatch reads it from the submit folder
    job_script.write_text(script)
    slurm = OneNodeSlurm(tmp_path / "slurm")
    try:
        slurm.start()
        submitted = slurm.run("bash", "-c", commands.replace("grade.sh", str(job_script)) + '\necho "array=$job"',
                              cwd=REPO)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        array = re.search(r"array=(\d+)", submitted.stdout).group(1)
        merge = re.search(r"Submitted batch job (\d+)", submitted.stdout).group(1)
        deadline = time.monotonic() + 900
        while slurm.run("squeue", "-h", "-o", "%i").stdout.strip():
            assert time.monotonic() < deadline, slurm.run("squeue").stdout
            time.sleep(2)
        logs = {p.name: p.read_text()[-2000:] for p in (shared / "logs").glob("*.out")}
        assert slurm.job_state(array) == {"COMPLETED"} and slurm.job_state(merge) == {"COMPLETED"}, logs
    finally:
        slurm.stop()
        job_script.unlink(missing_ok=True)
    assert sorted(p.name for p in (shared / "shards").iterdir()) == ["1", "2"]
    single = tmp_path / "single"
    autograde(shared / "submissions", single, "--config", str(shared / "grading.toml"))
    graded = shared / "graded"
    assert (graded / "grades.csv").read_bytes() == (single / "grades.csv").read_bytes()
    for name in ("report.html", "report.json"):
        assert (graded / "report" / name).read_bytes() == (single / "report" / name).read_bytes(), name
    assert len(json.loads((graded / "results.json").read_text())) == 4
