#!/usr/bin/env python
"""Run the GPU paths of notebooks 06 and 07 as plain Python (no Jupyter needed).

    python scripts/gpu_check.py                 # on a machine with CUDA: measure and check
    python scripts/gpu_check.py --cpu-rehearsal # run the same code on the CPU with gloo (tests the script itself)

Without CUDA (and without --cpu-rehearsal) it says so and exits 0: nothing is measured, nothing is faked.
With CUDA it prints:
  06 — the fp32 / bf16 / fp16 autocast table (ms per step, peak memory, final loss), synchronised vs
       unsynchronised timing, pinned vs pageable copies, memory_allocated vs memory_reserved, the seed
       claims that need a GPU, and one mixed-precision step (fp32 parameters kept, inf step skipped);
  07 — DDP with nccl on the visible GPUs (one process per GPU): final parameters against single-process
       training on the global batch, where the all-reduce fires and on which device its buffers live,
       and FSDP fully_shard bytes per rank with the final parameters against DDP's.
Exit status 1 when a check fails. `--json PATH` also writes every measurement to PATH.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from helpers.distributed import run_torchrun, write_script  # noqa: E402
from grader.mutants import reference_function  # noqa: E402
from helpers.precision import measure_precision, time_call  # noqa: E402

# notebook 06's reference answer; helpers/ must not carry it (students receive helpers/)
amp_train_step = reference_function("06_mixed_precision", "amp_train_step_answer", "amp_train_step", {"torch": torch})

FAILURES: list[str] = []
REPORT: dict[str, object] = {}


def verify(condition: bool, message: str) -> None:
    """Print a PASS/FAIL line and remember failures."""
    print(("  PASS  " if condition else "  FAIL  ") + message)
    if not condition:
        FAILURES.append(message)


def section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def check_06(device: torch.device, big: bool) -> None:
    section(f"06 — precision table on {device}")
    rows = []
    size = dict(steps=30, batch=4096, width=2048, depth=4) if big else dict(steps=5, batch=128, width=128)
    for dtype in (None, torch.bfloat16, torch.float16):
        if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            print("  bf16 autocast: SKIPPED — this GPU does not support bf16")
            continue
        rows.append(measure_precision(amp_train_step, device, dtype, **size))
    print(f"  {'setting':>28} | {'ms/step':>8} | {'peak MiB':>9} | {'final loss':>10} | skipped")
    for r in rows:
        peak = f"{r.peak_mib:9.1f}" if r.peak_mib is not None else "      n/a"
        print(f"  {r.label:>28} | {r.ms_per_step:8.2f} | {peak} | {r.final_loss:10.4f} | {r.skipped_steps}")
    REPORT["precision_table"] = [r.__dict__ for r in rows]
    verify(all(torch.isfinite(torch.tensor(r.final_loss)) for r in rows), "every precision row ends with a finite loss")

    section("06 — timing, pinned memory, allocator")
    n = 4096 if device.type == "cuda" else 256
    A = torch.randn(n, n, device=device)
    A @ A
    began = time.perf_counter()
    A @ A
    wrong = time.perf_counter() - began
    right = time_call(lambda: A @ A, device, repeats=5)
    print(f"  {n}x{n} matmul: unsynchronised timer {wrong * 1e3:.3f} ms, synchronised {right * 1e3:.3f} ms")
    REPORT["timing_ms"] = {"unsynchronised": wrong * 1e3, "synchronised": right * 1e3}
    if device.type == "cuda":
        host = torch.randn(64, 1024, 1024)
        pinned = host.pin_memory()
        pageable_s = time_call(lambda: host.to(device), device, repeats=3, warmup=1)
        pinned_s = time_call(lambda: pinned.to(device, non_blocking=True), device, repeats=3, warmup=1)
        print(f"  256 MiB host->GPU: pageable {pageable_s * 1e3:.2f} ms, pinned non_blocking {pinned_s * 1e3:.2f} ms")
        REPORT["copy_ms"] = {"pageable": pageable_s * 1e3, "pinned": pinned_s * 1e3}
        del host, pinned
        torch.cuda.empty_cache()
        big_t = torch.empty(256, 1024, 1024, device=device)
        alloc, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        del big_t
        after = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        print(f"  1 GiB tensor: allocated {alloc / 2**20:.0f} MiB, reserved {reserved / 2**20:.0f} MiB; "
              f"after del: allocated {after[0] / 2**20:.0f} MiB, reserved {after[1] / 2**20:.0f} MiB")
        verify(after[1] >= after[0], "memory_reserved >= memory_allocated after del (the caching allocator keeps the block)")

    section("06 — seed claims on this device")
    pred = torch.randn(32, 1000, device=device)
    _, idx = torch.max(pred, dim=1)
    print(f"  torch.max indices on {idx.device} for input on {pred.device}")
    REPORT["torch_max_indices_device"] = str(idx.device)
    if device.type == "cuda":
        probe = ("import torch\nb=torch.cuda.is_initialized()\na=torch.cuda.is_available()\n"
                 "m=torch.cuda.is_initialized()\ntorch.zeros(1,device='cuda')\nprint(b,a,m,torch.cuda.is_initialized())")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300).stdout.split()
        print(f"  fresh process: initialised before / is_available / after is_available / after first tensor: {out}")
        REPORT["cuda_init_probe"] = out
    x = torch.randn(4, 8)
    with torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16):
        moved = x.to(device)
        out_dtype = nn.Linear(8, 2).to(device)(moved).dtype
    print(f"  x.to({device.type}) inside autocast: {moved.dtype}; first layer ran, output {out_dtype}")
    verify(moved.dtype == torch.float32, ".to(device) inside autocast keeps the input's dtype")

    section("06 — one mixed-precision step (the notebook's amp_train_step)")
    low = torch.float16
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=1024.0)

    def step(X: torch.Tensor, y: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=low):
            loss = nn.functional.cross_entropy(net(X.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(16, 8, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    step(X, y)
    before = [p.detach().clone() for p in net.parameters()]
    step(torch.full((16, 8), float("inf")), y)
    verify(all(p.dtype == torch.float32 for p in net.parameters()), "parameters stay fp32 under fp16 autocast")
    verify(all(torch.equal(a, b) for a, b in zip(before, net.parameters())), "an inf step is skipped (parameters unchanged)")
    verify(scaler.get_scale() == 512.0, f"the scale backs off 1024 -> 512 on inf (got {scaler.get_scale():g})")


DDP_SCRIPT = r'''
import json, os, sys
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.fsdp import fully_shard

backend = sys.argv[1]
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}") if backend == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
ids = [device.index] if device.type == "cuda" else None
out = {}

# DDP training vs one process on the global batch
n, micro, epochs, lr, seed = 64 * world, 8, 2, 0.1, 3
def problem():
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 1))
    gen = torch.Generator().manual_seed(100)
    X = torch.randn(n, 5, generator=gen)
    return net, X, X.sum(1, keepdim=True).sin()
net, X, y = problem()
ddp = DDP(net.to(device), device_ids=ids)
data = TensorDataset(X, y)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=seed)
opt = torch.optim.SGD(ddp.parameters(), lr=lr)
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for xb, yb in DataLoader(data, batch_size=micro, sampler=sampler):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(xb.to(device)), yb.to(device)).backward()
        opt.step()
ref, X, y = problem()
ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
for epoch in range(epochs):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    for idx in perm.split(micro * world):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(X[idx]), y[idx]).backward()
        ref_opt.step()
out["ddp_vs_single_max_diff"] = max((a.detach().cpu() - b.detach()).abs().max().item()
                                    for a, b in zip(ddp.module.parameters(), ref.parameters()))

# where and when the all-reduce runs
events = []
dist._DEFAULT_FIRST_BUCKET_BYTES = 300_000
torch.manual_seed(0)
big = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(4)], nn.Linear(256, 1)).to(device)
model = DDP(big, bucket_cap_mb=0.3, device_ids=ids)
for p in model.parameters():
    p.register_post_accumulate_grad_hook(lambda p: events.append("grad"))
def hook(state, bucket):
    events.append("allreduce:" + str(bucket.buffer().device))
    return default_hooks.allreduce_hook(state, bucket)
model.register_comm_hook(None, hook)
x = torch.randn(16, 256, device=device)
for _ in range(2):
    events.clear()
    model(x).square().mean().backward()
    events.append("returned")
out["events"] = events

# FSDP fully_shard vs DDP
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
def local_bytes(ts):
    ts = [t.to_local() if hasattr(t, "to_local") else t for t in ts]
    return sum(t.numel() * t.element_size() for t in ts)
d = DDP(mlp(), device_ids=ids)
f = mlp()
for layer in f:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(f)
gen = torch.Generator().manual_seed(1)
Xc, yc = torch.randn(64 * world, 64, generator=gen).to(device), torch.randint(0, 10, (64 * world,), generator=gen).to(device)
mine = slice(rank, None, world)
stats = {}
for name, m in (("DDP", d), ("FSDP", f)):
    o = torch.optim.Adam(m.parameters(), lr=1e-2)
    for k in range(4):
        o.zero_grad()
        nn.functional.cross_entropy(m(Xc[mine][k * 16:(k + 1) * 16]), yc[mine][k * 16:(k + 1) * 16]).backward()
        g = local_bytes([p.grad for p in m.parameters()])
        o.step()
    state = [v for s in o.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    stats[name] = dict(params=local_bytes(list(m.parameters())), grads=g, optimizer=local_bytes(state))
stats["max_diff"] = max((a.full_tensor() - b).abs().max().item() for a, b in zip(f.parameters(), d.module.parameters()))
out["fsdp"] = stats
print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
'''


def check_07(backend: str, nproc: int) -> None:
    section(f"07 — DDP and FSDP with {backend} on {nproc} process(es)")
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    script = write_script(DDP_SCRIPT, folder, "ddp_check.py")
    result = run_torchrun(script, nproc, script_args=[backend], timeout=540, echo=False)
    print(f"  launch took {result.seconds:.1f} s")
    REPORT["ddp"] = {}
    for rank in range(nproc):
        line = next(l for l in result.lines_from_rank(rank) if l.startswith("RESULT "))
        out = json.loads(line[len("RESULT "):])
        REPORT["ddp"][rank] = out
        verify(out["ddp_vs_single_max_diff"] < 1e-4,
               f"rank {rank}: DDP final parameters vs single process on the global batch, max diff {out['ddp_vs_single_max_diff']:.2g}")
        events = out["events"]
        reduces = [i for i, e in enumerate(events) if e.startswith("allreduce")]
        grads = [i for i, e in enumerate(events) if e == "grad"]
        devices = sorted({e.split(":", 1)[1] for e in events if e.startswith("allreduce")})
        print(f"  rank {rank}: {len(reduces)} bucket all-reduces, buffers on {devices}; "
              f"first all-reduce before the last gradient: {bool(reduces) and reduces[0] < grads[-1]}")
        verify(all(i < events.index("returned") for i in reduces), f"rank {rank}: every all-reduce starts inside backward()")
        if backend == "nccl":
            verify(all(d.startswith("cuda") for d in devices), f"rank {rank}: bucket buffers stay on the GPU (no copy to the CPU)")
        s = out["fsdp"]
        print(f"  rank {rank}: bytes DDP {s['DDP']} vs FSDP {s['FSDP']}; FSDP vs DDP params max diff {s['max_diff']:.2g}")
        verify(s["max_diff"] < 1e-4, f"rank {rank}: FSDP final parameters equal DDP's")
        if nproc > 1:
            verify(s["FSDP"]["params"] < s["DDP"]["params"], f"rank {rank}: FSDP holds fewer parameter bytes than DDP")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-rehearsal", action="store_true", help="run the same checks on the CPU with gloo (small sizes)")
    parser.add_argument("--json", type=Path, help="also write the measurements to this file")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        print(f"CUDA: {count} device(s): " + ", ".join(torch.cuda.get_device_name(i) for i in range(count)))
        check_06(torch.device("cuda"), big=True)
        check_07("nccl", min(count, 8))
    elif args.cpu_rehearsal:
        print("CPU rehearsal: no GPU numbers below — this only exercises the script's code paths with gloo.")
        check_06(torch.device("cpu"), big=False)
        check_07("gloo", 2)
    else:
        print("No CUDA device is visible to torch (torch.cuda.is_available() is False): the GPU paths of notebooks "
              "06 and 07 cannot be measured here, and nothing was run. Run this script on a machine with a GPU, "
              "or pass --cpu-rehearsal to exercise the same code on the CPU.")
        return 0
    if args.json:
        args.json.write_text(json.dumps(REPORT, indent=1, default=str))
    print(f"\n{len(FAILURES)} check(s) failed" if FAILURES else "\nall checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
