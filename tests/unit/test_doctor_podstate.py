"""The doctor's reading of why the agent's pod does not run: a hostPath the node lacks, named with the chart's
value that points there; an image the node does not have; a crash loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightkube.resources.core_v1 import Pod

from ascend_agent.doctor.cluster import _judged_first
from ascend_agent.doctor.podstate import CHART_VALUES, not_running
from tests.support import ROOT
from tests.support.manifests import documents


def _pod(volumes: list[dict[str, Any]], waiting: dict[str, str] | None = None) -> Pod:
    statuses = []
    if waiting is not None:
        statuses = [{"name": "ascend-agent", "image": "ascend-agent:0.1.0", "imageID": "", "ready": False,
                     "restartCount": 4, "state": {"waiting": waiting}}]  # fmt: skip
    return Pod.from_dict(
        {
            "metadata": {"name": "ascend-device-plugin-daemonset-x1", "namespace": "kube-system"},
            "spec": {"containers": [{"name": "ascend-agent"}], "volumes": volumes},
            "status": {"phase": "Pending", "containerStatuses": statuses},
        }
    )


def _host_path(name: str, path: str, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def test_a_missing_directory_is_named_with_the_charts_value(tmp_path: Path) -> None:
    (tmp_path / "usr/local/dcmi").mkdir(parents=True)
    pod = _pod(
        [
            _host_path("dcmi", "/usr/local/dcmi", "Directory"),
            _host_path("ascend-driver", "/usr/local/Ascend/driver", "Directory"),
            _host_path("cdi", "/var/run/cdi", "DirectoryOrCreate"),  # the kubelet makes it
        ],
        {"reason": "ContainerCreating"},
    )
    stuck = not_running(pod, tmp_path)
    assert stuck is not None
    assert stuck.detail == "volume ascend-driver: /usr/local/Ascend/driver is not on this node (a directory)"
    assert (
        stuck.hint == "make /usr/local/Ascend/driver on this node, or point the chart's host.driverDir at it"
    )


def test_a_directory_where_a_file_belongs_is_the_wrong_kind(tmp_path: Path) -> None:
    (tmp_path / "usr/local/bin/npu-smi").mkdir(parents=True)
    stuck = not_running(_pod([_host_path("npu-smi", "/usr/local/bin/npu-smi", "File")]), tmp_path)
    assert (
        stuck is not None and stuck.detail == "volume npu-smi: /usr/local/bin/npu-smi is not a file (a file)"
    )


def test_an_image_the_node_lacks_says_how_to_get_it_there(tmp_path: Path) -> None:
    stuck = not_running(_pod([], {"reason": "ErrImageNeverPull", "message": "not present"}), tmp_path)
    assert stuck is not None
    assert stuck.detail == "container ascend-agent waits: ErrImageNeverPull (ascend-agent:0.1.0)"
    assert "ctr -n k8s.io images import" in stuck.hint


def test_a_crash_loop_points_at_the_last_run(tmp_path: Path) -> None:
    stuck = not_running(_pod([], {"reason": "CrashLoopBackOff"}), tmp_path)
    assert stuck is not None
    assert stuck.hint.endswith("kubectl logs --previous -n kube-system ascend-device-plugin-daemonset-x1")


def test_a_running_pod_is_never_judged_by_the_paths_a_doctor_inside_it_cannot_see(tmp_path: Path) -> None:
    pod = _pod([_host_path("device-plugins", "/var/lib/kubelet/device-plugins", "Directory")])
    pod.status.phase = "Running"
    assert not_running(pod, tmp_path) is None


def test_a_pod_whose_paths_are_all_there_and_that_waits_for_nothing_is_not_stuck(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    assert not_running(_pod([_host_path("dev", "/dev", "Directory")]), tmp_path) is None


def test_every_required_host_path_of_the_chart_has_its_value_named() -> None:
    """Every hostPath the chart's renders require (but the node's own /dev and /sys) is a value to set."""
    renders = sorted((ROOT / "tests" / "fixtures" / "helm").glob("*.yaml"))
    required = {
        volume["name"]
        for _, doc in documents(renders)
        if doc["kind"] == "DaemonSet"
        for volume in doc["spec"]["template"]["spec"]["volumes"]
        if volume.get("hostPath", {}).get("type") in ("Directory", "File")
        and volume["hostPath"]["path"] not in ("/dev", "/sys")
    }
    assert required and required <= set(CHART_VALUES), required - set(CHART_VALUES)


def test_the_doctor_judges_the_pod_that_is_not_going_and_then_the_newest() -> None:
    """During a rolling update the node has the old pod (terminating) and the new one."""

    def pod(name: str, made: str, going: bool) -> Pod:
        meta: dict[str, Any] = {"name": name, "namespace": "kube-system", "creationTimestamp": made}
        if going:
            meta["deletionTimestamp"] = "2026-12-07T10:05:00Z"
        return Pod.from_dict({"metadata": meta, "spec": {"containers": [{"name": "ascend-agent"}]}})

    old = pod("ds-old", "2026-12-07T10:00:00Z", going=True)
    new = pod("ds-new", "2026-12-07T10:04:00Z", going=False)
    newer_going = pod("ds-x", "2026-12-07T10:06:00Z", going=True)
    assert max([old, new, newer_going], key=_judged_first) is new
    assert max([pod("a", "2026-12-07T10:00:00Z", False), new], key=_judged_first) is new
