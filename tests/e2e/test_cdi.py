"""The CDI spec the agent writes and the cdi_devices Allocate returns agree."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.agent_process import fake_agent
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin


def test_cdi_spec_and_allocate_agree(kubelet: KubeletStandin, short_dir: Path) -> None:
    cdi_dir = short_dir / "cdi"
    config = short_dir / "config.yaml"
    config.write_text("fakeChips: 4\n")
    process = fake_agent(kubelet.directory, "--cdi-spec-dir", str(cdi_dir), "--config", str(config))
    try:
        kubelet.wait_registrations(1)
        process.wait_log("Wrote CDI spec")
        spec_path = cdi_dir / "huawei.com-npu.yaml"
        spec = yaml.safe_load(spec_path.read_text())
        assert spec["kind"] == "huawei.com/npu"
        assert tuple(int(part) for part in spec["cdiVersion"].split(".")) >= (0, 6, 0)
        assert [d["name"] for d in spec["devices"]] == [f"Ascend910-{i}" for i in range(4)]
        assert spec["devices"][2]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/davinci2", "permissions": "rw"}
        ]
        shared = [node["path"] for node in spec["containerEdits"]["deviceNodes"]]
        assert shared == ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
        assert not list(cdi_dir.glob(".*")), "no temporary file left behind"

        channel, stub = kubelet.plugin_stub()
        pb = kubelet.pb
        response = stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=["Ascend910-3", "Ascend910-1"])]
            )
        )
        channel.close()
        names = [cdi.name for cdi in response.container_responses[0].cdi_devices]
        assert names == ["huawei.com/npu=Ascend910-1", "huawei.com/npu=Ascend910-3"]
        assert {name.split("=")[1] for name in names} <= {d["name"] for d in spec["devices"]}

        config.write_text("fakeChips: 6\n")
        process.wait_log("Wrote CDI spec .* with 6 devices")
        assert len(yaml.safe_load(spec_path.read_text())["devices"]) == 6

        code, _ = process.terminate()
        assert code == 0
        # Containers that restart while the agent is down (an upgrade, a reboot) still resolve their devices.
        assert spec_path.exists(), "the spec stays when the agent stops"
        assert len(yaml.safe_load(spec_path.read_text())["devices"]) == 6
    finally:
        process.close()


def test_a_spec_directory_that_cannot_be_written_is_not_ready_and_retried(
    kubelet: KubeletStandin, short_dir: Path
) -> None:
    """Allocate names CDI devices: while their spec cannot be written, /readyz says so, and the write is tried
    again without waiting for the next device change."""
    cdi_dir = short_dir / "cdi"
    cdi_dir.mkdir()
    cdi_dir.chmod(0o777)  # anyone could replace the spec: the agent writes none there
    port = free_port()
    process = fake_agent(
        kubelet.directory, "--cdi-spec-dir", str(cdi_dir), "--metrics-address", f"127.0.0.1:{port}"
    )
    try:
        kubelet.wait_registrations(1)
        _, body = wait_answer(port, "/readyz", lambda status, body: status == 503 and "CDI" in body)
        assert f"cannot write the CDI spec in {cdi_dir}" in body
        cdi_dir.chmod(0o755)
        assert wait_answer(port, "/readyz", lambda status, _: status == 200) == (200, "ready\n")
        assert (cdi_dir / "huawei.com-npu.yaml").exists()
    finally:
        process.close()
