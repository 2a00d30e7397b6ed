"""``npuExporterMetrics``: the chip series under Huawei npu-exporter's names on /metrics, from the devfs
backend over a fake npu-smi, and gone again when a reload turns the setting off."""

from __future__ import annotations

import signal
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support import CONSTRUCTED
from tests.support.agent_process import AgentProcess
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi

A3_ALARM = (CONSTRUCTED / "Ascend910-A3x16-24.1.rc3.7-info-alarm.txt").read_text()
A3_HEALTH = (CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-health-i-1-c-1-alarm.txt").read_text()


def _series(body: str) -> dict[str, dict[str, tuple[dict[str, str], float]]]:
    """Name -> the chip id (or "" for a node's series) -> (labels, value)."""
    found: dict[str, dict[str, tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            key = sample.labels.get("id", sample.labels.get("device", ""))
            found.setdefault(sample.name, {})[key] = (sample.labels, sample.value)
    return found


def test_the_setting_shows_the_chip_series_under_npu_exporters_names(
    kubelet: KubeletStandin, host: HostTree, short_dir: Path
) -> None:
    host.add_chips(range(16))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", A3_ALARM)
    npu_smi.set_output("info -t health -i 1 -c 1", A3_HEALTH)
    config = short_dir / "c.yaml"
    config.write_text("npuExporterMetrics: true\n")
    port = free_port()
    process = AgentProcess(
        [
            "run",
            "--backend",
            "devfs",
            "--host-root",
            str(host.root),
            "--npu-smi",
            str(npu_smi.path),
            "--kubelet-dir",
            str(kubelet.directory),
            "--metrics-address",
            f"127.0.0.1:{port}",
            "--health-interval",
            "1",
            "--config",
            str(config),
        ]
    )
    try:
        _, body = wait_answer(
            port, "/metrics", lambda _, body: "npu_chip_info_error_code{" in body, what="npu-exporter names"
        )
        series = _series(body)
        model = series["ascend_agent_chip_info"]["Ascend910-0"][0]["model"]
        assert series["npu_chip_info_temperature"]["0"] == (
            {
                "id": "0",
                "model_name": model,
                "vdie_id": "",
                "pcie_bus_info": "0000:9D:00.0",
                "namespace": "",
                "pod_name": "",
                "container_name": "",
            },
            36.0,
        )
        assert series["npu_chip_info_power"]["0"][1] == 181.4
        assert "1" not in series["npu_chip_info_power"], "npu-smi printed '-': no series, as the agent's"
        assert series["npu_chip_info_hbm_total_memory"]["0"][1] == 65536
        assert series["npu_chip_info_hbm_used_memory"]["15"][1] == 3199
        assert series["npu_chip_info_utilization"]["2"][1] == 0
        assert "npu_chip_info_total_memory" not in series, "the A3's 0 / 0 DDR memory is none"
        assert series["npu_chip_info_error_code"]["3"][1] == 0x80E3A203
        assert series["npu_chip_info_health_status"]["3"][1] == 0
        assert series["npu_chip_info_health_status"]["4"][1] == 1
        assert series["machine_npu_nums"][""][1] == 16
        assert series["machine_unhealthy_npu_nums"][""][1] == 1

        config.write_text("npuExporterMetrics: false\n")
        process.proc.send_signal(signal.SIGHUP)
        _, body = wait_answer(
            port, "/metrics", lambda _, body: "npu_chip_info_" not in body, what="no npu-exporter names"
        )
        assert "machine_npu_nums" not in body and "ascend_agent_chip_temperature_celsius{" in body
    finally:
        process.close()
