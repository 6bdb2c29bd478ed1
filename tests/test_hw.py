"""Hardware description: parsers on recorded nvidia-smi output, fingerprints, mode."""
import pytest

from labutils import hw

TOPO_2xH200 = (  # `nvidia-smi topo -m` on the reference machine (header underlined with ANSI codes)
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
NVLINK_2xH200 = "".join(
    f"GPU {g}: NVIDIA H200 (UUID: GPU-x)\n" + "".join(f"\t Link {i}: 26.562 GB/s\n" for i in range(18))
    for g in range(2))
TOPO_PCIE_NIC = ("\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\n"
                 "GPU0\t X \tPIX\tSYS\tNODE\t0-15\nGPU1\tPIX\t X \tSYS\tNODE\t0-15\n"
                 "GPU2\tSYS\tSYS\t X \tSYS\t16-31\nNIC0\tNODE\tNODE\tSYS\t X \n")


def test_parse_topo_reference():
    assert hw.parse_topo_matrix(TOPO_2xH200) == {(0, 1): "NV18", (1, 0): "NV18"}


def test_parse_topo_pcie_and_nics_ignored():
    links = hw.parse_topo_matrix(TOPO_PCIE_NIC)
    assert links[(0, 1)] == "PIX" and links[(0, 2)] == "SYS" and len(links) == 6


def test_parse_topo_garbage():
    assert hw.parse_topo_matrix("") == {} and hw.parse_topo_matrix("No devices were found") == {}


def test_parse_nvlink():
    speeds = hw.parse_nvlink_speeds(NVLINK_2xH200 + "GPU 2: X\n\t Link 0: <inactive>\n")
    assert len(speeds[0]) == 18 and speeds[1][0] == 26.562 and speeds[2] == []


@pytest.mark.parametrize("gen, width, gbps", [(5, 16, 63.0), (4, 16, 31.5), (3, 16, 15.8), (4, 8, 15.8)])
def test_pcie_peak(gen, width, gbps):
    assert hw.pcie_peak_gbps(gen, width) == gbps


def test_pcie_parse_and_errors():
    assert hw.parse_pcie("0, 5, 16\n1, 5, 16\n[N/A]\n") == {0: (5, 16), 1: (5, 16)}
    with pytest.raises(ValueError, match="unknown PCIe link gen 9"):
        hw.pcie_peak_gbps(9, 16)


def _info(**kw):
    base = dict(mode="multi-gpu", gpus=[hw.GPU(0, "NVIDIA H200", 140.4), hw.GPU(1, "NVIDIA H200", 140.4)],
                links={(0, 1): "NV18", (1, 0): "NV18"}, peer_access={(0, 1): True, (1, 0): True},
                nvlink_gbps=hw.parse_nvlink_speeds(NVLINK_2xH200), pcie={0: (5, 16)},
                torch_version="2.11.0+cu130", cuda_version="13.0", nccl_version="2.28.9",
                driver_version="580.159.04", python_version="3.12.3", cpu_count=32)
    base.update(kw)
    return hw.HardwareInfo(**base)


def test_fingerprint_and_table():
    info = _info()
    assert info.fingerprint() == ("2x NVIDIA H200 | NV18 | torch 2.11.0+cu130 | CUDA 13.0 | NCCL 2.28.9 | "
                                  "driver 580.159.04 | no NCCL_* set")
    assert info.link_peak_gbps == 478.1 and info.pcie_peak_gbps == 63.0
    text = str(info)
    assert "link GPU0-GPU1" in text and "NV18 (peer access: True)" in text and "18 links x 26.562 GB/s" in text
    assert "<table>" in info._repr_html_()


def test_a_gpu_fingerprint_ends_with_the_nccl_variables_set():
    """NCCL_NVLS_ENABLE=0 changes what an all-reduce on an NVSwitch board does: the fingerprint says it."""
    env = hw.nccl_env({"NCCL_NVLS_ENABLE": "0", "PATH": "/bin", "NCCL_ALGO": "Ring", "TORCH_NCCL_X": "1"})
    assert list(env) == ["NCCL_ALGO", "NCCL_NVLS_ENABLE"]               # NCCL_* only, sorted
    info = _info(nccl_env=env)
    assert info.fingerprint().endswith("| driver 580.159.04 | NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0")
    assert ("NCCL_* variables", "NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0") in info.rows()
    # one line, stable: values a shell would split are quoted, a newline is written as \n
    text = hw.nccl_env_text({"NCCL_B": "a b", "NCCL_A": "x\ny"})
    assert text == "NCCL_A='x\\ny' NCCL_B='a b'" and "\n" not in text
    assert hw.nccl_env_text({}) == "no NCCL_* set"
    assert hw.nccl_env_text(None) == "NCCL_* variables not recorded"   # unknown, never guessed


def test_describe_reads_the_nccl_variables_of_this_process(monkeypatch):
    for k in list(hw.nccl_env()):
        monkeypatch.delenv(k)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    info = hw.describe(peer_access=False)
    assert info.nccl_env == {"NCCL_NVLS_ENABLE": "0"}
    if info.gpus:
        assert info.fingerprint().endswith(" | NCCL_NVLS_ENABLE=0")
    else:   # gloo ranks do not read NCCL's variables: a CPU fingerprint has no NCCL part
        assert "NCCL" not in info.fingerprint()


def test_cpu_fingerprint():
    info = _info(mode="cpu", gpus=[], links={}, peer_access={}, nvlink_gbps={}, pcie={},
                 cuda_version="none", nccl_version="none", driver_version="none")
    assert info.fingerprint().startswith("CPU only (") and "NCCL" not in info.fingerprint()
    assert info.link_peak_gbps is None and info.pcie_peak_gbps is None


def test_detect_mode_and_describe_here():
    assert [hw.detect_mode(n) for n in (0, 1, 2, 8)] == ["cpu", "single-gpu", "multi-gpu", "multi-gpu"]
    info = hw.describe()
    assert info.mode in hw.MODES and info.torch_version and info.fingerprint()


def test_summarize_nvlinks_names_the_remote_ends_and_the_version():
    assert hw.summarize_nvlinks([(2, 6)] * 18) == {"links": 18, "remote": {"NVSwitch": 18}, "version": "4.0"}
    mixed = hw.summarize_nvlinks([(0, 4)] * 2 + [(2, 5)] * 2 + [(7, 4)])
    assert mixed == {"links": 5, "remote": {"GPU": 2, "NVSwitch": 2, "type 7": 1}, "version": None}
    assert hw.summarize_nvlinks([(2, 7)], hopper=True)["version"] == "4.0"    # Hopper reported as NVLink 5
    assert hw.summarize_nvlinks([(2, 7)])["version"] == "5.0"
    assert hw.summarize_nvlinks([]) == {"links": 0, "remote": {}, "version": None}


def test_link_data_peak_and_remote_ends():
    info = _info(nvlinks={0: hw.summarize_nvlinks([(2, 6)] * 18)})
    assert info.link_data_peak_gbps == 450.0 and info.link_peak_gbps == 478.1   # data rate < line rate
    assert info.nvlink_remote == {"NVSwitch": 18}
    text = str(info)
    assert "18 to NVSwitch (NVLink 4.0)" in text and "NVLink data rate per GPU" in text
    assert _info(nvlinks={0: hw.summarize_nvlinks([(0, 7)] * 18)}).link_data_peak_gbps == 900.0
    unknown = _info()                                   # no NVML: no data rate, no remote ends
    assert unknown.link_data_peak_gbps is None and unknown.nvlink_remote == {}
    assert _info(nvlinks={0: hw.summarize_nvlinks([(2, 99)])}).link_data_peak_gbps is None


def test_nvml_nvlinks_is_empty_without_nvml(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import fails, as on a machine without the package
    assert hw.nvml_nvlinks(2) == {}
