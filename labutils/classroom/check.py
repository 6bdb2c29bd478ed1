"""``python -m labutils classroom check``: is every learner's GPU slice usable? One line per slice.

    python -m labutils classroom check                        # the node, cut into pairs
    python -m labutils classroom check --slice-size 4         # ... into fours
    python -m labutils classroom check --hub-state STATE.json # the slices the hub gave, by learner
    python -m labutils classroom check --mine                 # only the GPUs this process is given
    python -m labutils classroom check --fake-gpus 8          # plan a class on a machine without GPUs

For each slice: the GPUs its ranks see (``CUDA_VISIBLE_DEVICES``), the slowest link between them
(NVML), a NCCL all_reduce over one rank per GPU whose sum must be 1 + 2 + ... + n, and the free
memory of each GPU against ``--min-free-gib``. Exit status: 0 every slice passed, 1 some slice
failed, 2 no GPUs (nothing on a GPU was checked; the output says what was).
"""
from __future__ import annotations

import os

from . import book, slices as sl

OK, FAIL = "OK", "FAIL"


def add_arguments(parser) -> None:
    parser.add_argument("--slice-size", type=int, default=2, help="GPUs per learner (default 2)")
    parser.add_argument("--learners", type=int, default=None, help="check only this many slices")
    parser.add_argument("--exclude", default="", metavar="GPUS",
                        help="GPUs in no slice, e.g. 5 or 5,6 (as the hub's LABS_EXCLUDE_GPUS)")
    parser.add_argument("--hub-state", default=None, metavar="FILE",
                        help="the hub's slice assignment (classroom/jupyterhub_config.py writes it)")
    parser.add_argument("--mine", action="store_true",
                        help="check the GPUs in this process's CUDA_VISIBLE_DEVICES as one slice")
    parser.add_argument("--fake-gpus", default=None, metavar="SPEC",
                        help=f"plan with a fake topology ('8' or '4:0-1=NV4,2-3=NV4,*=SYS'; also ${sl.FAKE_ENV})")
    parser.add_argument("--min-free-gib", type=float, default=4.0,
                        help="a GPU with less free memory fails (default 4)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for each slice's all_reduce")


def slice_ranks(rank, world_size):
    """In each rank of a slice: what it sees, and its share of the all_reduce."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)], device=torch.device("cuda", rank))
    dist.all_reduce(t)
    return {"visible": torch.cuda.device_count(), "sum": int(t.item())}


def cpu_ranks(rank, world_size):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return int(t.item())


def free_gib(gpus) -> list[float]:
    """Free memory of each GPU (NVML indices), in GiB."""
    import pynvml
    pynvml.nvmlInit()
    try:
        return [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(g)).free / 2**30 for g in gpus]
    finally:
        pynvml.nvmlShutdown()


def check_slice(topo: sl.Topology, gpus: tuple, min_free_gib: float, timeout_s: float) -> tuple[str, str]:
    """(status, details) of one slice on real GPUs."""
    import labutils
    n, expected = len(gpus), len(gpus) * (len(gpus) + 1) // 2
    problems, parts = [], [f"link {sl.worst_link(topo, gpus)}"]
    try:
        results = labutils.launch(slice_ranks, world_size=n, backend="nccl", timeout=timeout_s,
                                  output="quiet", env=sl.slice_env(gpus))
        visible = min(r["visible"] for r in results)
        sums = {r["sum"] for r in results}
        parts.append(f"visible {visible}/{n}")
        parts.append(f"all_reduce {sorted(sums)[0] if len(sums) == 1 else sorted(sums)} (want {expected})")
        if visible != n:
            problems.append(f"ranks see {visible} GPUs, not {n}")
        if sums != {expected}:
            problems.append(f"all_reduce gave {sorted(sums)}, not {expected}")
    except Exception as exc:  # noqa: BLE001 - one broken slice must not hide the others
        problems.append(f"all_reduce failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    try:
        free = free_gib(gpus)
        parts.append(f"free {min(free):.1f} GiB (least)")
        low = [g for g, f in zip(gpus, free) if f < min_free_gib]
        if low:
            problems.append(f"GPU {', '.join(map(str, low))} below {min_free_gib:g} GiB free "
                            f"(HINT: nvidia-smi shows whose process holds it)")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"free memory unreadable: {exc}")
    return (FAIL if problems else OK), "  ".join(parts) + ("  -- " + "; ".join(problems) if problems else "")


def parse_gpus(text: str) -> list[int]:
    try:
        return [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise sl.SliceError(f"--exclude {text!r} is not a list of GPU indices. HINT: --exclude 5,6") from None


def mine_gpus(topo: sl.Topology) -> tuple:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return tuple(range(topo.count))
    try:
        return tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise sl.SliceError(f"CUDA_VISIBLE_DEVICES={raw!r} is not a list of GPU indices. HINT: the hub "
                            f"sets indices (0,1); --mine does not read UUIDs.") from None


def run(args) -> int:
    try:
        return check(args)
    except sl.SliceError as exc:
        raise SystemExit(f"python -m labutils classroom check: {exc}") from None


def check(args) -> int:
    topo = sl.read_topology(args.fake_gpus)
    if topo.count == 0:
        return no_gpus(args)
    if args.hub_state:
        named = book.load_state(args.hub_state)
    elif args.mine:
        named = {os.environ.get("USER", "this process"): mine_gpus(topo)}
    else:
        plan = sl.plan_slices(topo, args.slice_size, args.learners, exclude=parse_gpus(args.exclude))
        named = {f"slice {k}": s for k, s in enumerate(plan)}
    bad = [g for s in named.values() for g in s if g >= topo.count]
    if bad:
        raise sl.SliceError(f"GPU {bad[0]} is not on this node (it has {topo.count}). "
                            f"HINT: the hub state or CUDA_VISIBLE_DEVICES is from another node.")
    width = max(len(k) for k in named) if named else 8
    kind = "fake " if topo.fake else ""
    print(f"classroom check: {topo.count} {kind}GPUs, {len(named)} slices")
    if topo.fake:
        for who, gpus in named.items():
            print(f"{who:<{width}}  GPUs {','.join(map(str, gpus)):<8}  link {sl.worst_link(topo, gpus):<4}  "
                  f"PLANNED (fake topology: nothing run)")
        print("Checked: the slice plan only. Not checked (no real GPUs): visibility, NCCL all_reduce, "
              "free memory.")
        return 0
    failed = 0
    for who, gpus in named.items():
        status, details = check_slice(topo, gpus, args.min_free_gib, args.timeout)
        failed += status == FAIL
        print(f"{who:<{width}}  GPUs {','.join(map(str, gpus)):<8}  {status:<4}  {details}", flush=True)
    print(f"{len(named) - failed}/{len(named)} slices OK")
    return 1 if failed else 0


def no_gpus(args) -> int:
    import labutils
    print("classroom check: no GPUs on this node (NVML reports none, or no NVIDIA driver is loaded).")
    print("Not checked: slices, links, NCCL all_reduce, free GPU memory -- there is nothing to check them on.")
    try:
        sums = labutils.launch(cpu_ranks, world_size=2, backend="gloo", timeout=args.timeout, output="quiet")
        print(f"Checked: 2 gloo ranks on the CPU all_reduce 1 + 2 = {sums[0]}: "
              f"{'OK' if sums == [3, 3] else 'FAIL'} (ranks start and meet; labs run in CPU mode).")
    except Exception as exc:  # noqa: BLE001
        print(f"Checked: 2 gloo ranks on the CPU: FAIL ({type(exc).__name__}: {exc})")
    print(f"HINT: run it on the GPU node, or plan a class here with --fake-gpus 8 (or ${sl.FAKE_ENV}).")
    return 2
