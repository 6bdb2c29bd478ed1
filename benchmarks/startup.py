"""Where the seconds of starting ranks go: ``import torch`` with and without cached bytecode, then a
rank's own phases (import, CUDA context, process group, first collective).

    python benchmarks/startup.py                              # gloo on CPU; NCCL with >= 2 GPUs
    python benchmarks/startup.py > benchmarks/startup_2xH200.txt   # the reference run

Every fresh interpreter -- a notebook's kernel, each rank of ``labutils.launch`` or a ``RankPool`` --
imports torch. Python reads a module's compiled bytecode from ``__pycache__`` (or from the folder
``PYTHONPYCACHEPREFIX`` names); where there is none and writing it is forbidden
(``PYTHONDONTWRITEBYTECODE=1``), every interpreter compiles each module of torch again.

1. ``import torch`` in a fresh interpreter, ``REPEAT`` times each way: as this environment is (the
   bytecode as installed, writing forbidden) and with the bytecode compiled once into a folder of its
   own (``PYTHONPYCACHEPREFIX``). Wall-clock, median.
2. Two ranks started side by side (as a launch starts them), each timing its own phases with
   ``time.perf_counter``: ``import torch``; the CUDA context (NCCL only); ``init_process_group``
   (eager NCCL communicator, with ``device_id``); the first ``all_reduce`` of one number, synchronised.
   Slowest rank per phase; run in the environment as it is.

A benchmark, not a test: it asserts nothing and prints what it measured with the machine's fingerprint.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPEAT = 5

RANK = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch, torch.distributed as dist
t1 = time.perf_counter()
rank, nccl = int(os.environ["RANK"]), sys.argv[1] == "nccl"
if nccl:
    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")
t2 = time.perf_counter()
kw = {"device_id": torch.device("cuda", rank)} if nccl else {}
dist.init_process_group(sys.argv[1], **kw)
t3 = time.perf_counter()
x = torch.ones(1, device="cuda" if nccl else "cpu")
dist.all_reduce(x)
if nccl:
    torch.cuda.synchronize()
t4 = time.perf_counter()
dist.destroy_process_group()
print(json.dumps({"import torch": t1 - t0, "CUDA context": t2 - t1, "init_process_group": t3 - t2,
                  "first all_reduce": t4 - t3}))
"""


def import_seconds(env: dict) -> float:
    """Median wall time of ``python -c 'import torch'`` in a fresh interpreter."""
    samples = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def rank_phases(backend: str, env: dict) -> dict:
    """Each phase's seconds on the slowest of two ranks started side by side."""
    with socket.socket() as s:  # a free port for the rendezvous, chosen by the OS
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", RANK, backend], stdout=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port))) for r in range(2)]
    phases = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return {k: max(p[k] for p in phases) for k in phases[0]}


def main() -> None:
    import torch
    from labutils import hw
    torch_dir = Path(torch.__file__).parent
    as_is = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    as_is["PYTHONDONTWRITEBYTECODE"] = "1"
    shipped = (torch_dir / "__pycache__").is_dir()
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    print("# benchmarks/startup.py")
    print(f"# machine: {hw.describe(peer_access=False).fingerprint()}")
    print(f"# torch installed with bytecode (__pycache__ beside its modules): {shipped}")
    print(f"\nimport torch in a fresh interpreter, median of {REPEAT}:")
    print(f"  bytecode as installed, writing forbidden : {import_seconds(as_is):6.2f} s")
    with tempfile.TemporaryDirectory(prefix="startup-pycache-") as cache:
        cached = dict(as_is, PYTHONPYCACHEPREFIX=cache)
        cached.pop("PYTHONDONTWRITEBYTECODE")
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import compileall, sys; [compileall.compile_dir(p, quiet=2, "
                        "workers=0) for p in sys.path if p and not p.endswith('.zip')]"], env=cached, check=True,
                       stderr=subprocess.DEVNULL)  # the warnings of test files inside packages
        print(f"  bytecode compiled once into a folder     : {import_seconds(cached):6.2f} s"
              f"   (compiling took {time.perf_counter() - t:.1f} s, once)")
        print(f"\ntwo {backend} ranks started side by side, slowest rank per phase:")
        for name, env in (("as installed", as_is), ("bytecode cached", cached)):
            phases = rank_phases(backend, env)
            print(f"  {name:16s}: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
                  + f"  (sum {sum(phases.values()):.2f} s)")


if __name__ == "__main__":
    main()
