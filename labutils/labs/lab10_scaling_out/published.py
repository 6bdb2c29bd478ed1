"""Figures this lab compares with but cannot measure: each with its source and the settings it holds for.

None of them is a measurement of this course's machines; the notebook says so wherever it prints one.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    what: str
    settings: str
    source: str


H100_8GPU_RING_BUSBW = Figure(
    370.0, "GB/s", "all_reduce busbw on 8 H100 SXM (NVLink 4 through NVSwitch), ring",
    "NCCL_ALGO=RING (NVLS off), large messages; the effective NVLink rate after NCCL's protocol overhead",
    "S. Jeaugey (NCCL team), NVIDIA/nccl-tests issue #212, 2024-05-06")
H100_8GPU_NVLS_BUSBW = Figure(
    480.0, "GB/s", "all_reduce busbw on 8 H100 SXM, NCCL's default (NVLS: NVLink SHARP, reduction in the NVSwitch)",
    "NVLS on (NCCL >= 2.17 default on NVSwitch systems), messages well above 256 MiB",
    "S. Jeaugey (NCCL team), NVIDIA/nccl-tests issue #212, 2024-05-06")
NVLINK4_LINE_RATE = Figure(
    450.0, "GB/s", "NVLink 4 per H100/H200 GPU, one direction (18 links)",
    "line rate, before protocol overhead", "NVIDIA H100 / H200 datasheets (900 GB/s both directions)")
IB_NDR_PER_NIC = Figure(
    50.0, "GB/s", "InfiniBand NDR per NIC, one direction (400 Gb/s)",
    "line rate of one ConnectX-7 NDR port; a DGX/HGX H100 or H200 node has 8 of them for the GPUs",
    "NVIDIA ConnectX-7 datasheet; NVIDIA DGX H100 user guide (8 x 400 Gb/s compute NICs)")
H100_BF16_DENSE_FLOPS = Figure(
    989e12, "FLOP/s", "H100/H200 SXM bf16 dense tensor-core peak",
    "without sparsity", "NVIDIA H100 and H200 datasheets")
