// Command ranktable-decode decodes what a rank table is made from and what it is, with Go's encoding/json and
// strictly (DisallowUnknownFields), into types written here from the published field names: the pod annotation
// ascend.kubectl.kubernetes.io/ascend-910-configuration (the fields Huawei's device plugin writes and
// ascend-operator reads) and hccl.json v1.0 or v1.2 (the fields of MindCluster's hccl.json description).
//
// Input on stdin: {"configuration": "...", "hccl": "...", "version": "1.0"|"1.2"}; either text may be empty
// (not checked). Output: one line, "ok ..." with what was decoded, or "error: ..." and exit status 1.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"ascend-agent/interop/strictjson"
)

// Dev and Instance: the pod's configuration annotation.
type Dev struct {
	DeviceID      string            `json:"device_id"`
	DeviceIP      string            `json:"device_ip"`
	SuperDeviceID string            `json:"super_device_id,omitempty"`
	LevelList     []json.RawMessage `json:"levelList,omitempty"`
}

type Instance struct {
	PodName     string `json:"pod_name"`
	ServerID    string `json:"server_id"`
	HostIP      string `json:"host_ip"`
	SuperPodID  int32  `json:"super_pod_id"`
	Devices     []Dev  `json:"devices"`
	RackID      int32  `json:"rack_id"`
	ServerIndex string `json:"server_index"`
	ServerIP    string `json:"server_ip"`
}

// Device, Server, RankTable and SuperPod: hccl.json. Every value is a string.
type Device struct {
	DeviceID      string `json:"device_id"`
	DeviceIP      string `json:"device_ip"`
	SuperDeviceID string `json:"super_device_id,omitempty"`
	RankID        string `json:"rank_id"`
}

type Server struct {
	Device       []Device `json:"device"`
	HardwareType string   `json:"hardware_type,omitempty"`
	ServerID     string   `json:"server_id"`
	HostIP       string   `json:"host_ip"`
	ContainerIP  string   `json:"container_ip,omitempty"`
}

type RankTable struct {
	Status      string   `json:"status"`
	ServerList  []Server `json:"server_list,omitempty"`
	ServerCount string   `json:"server_count,omitempty"`
	Version     string   `json:"version,omitempty"`
}

type SuperPodServer struct {
	ServerID string `json:"server_id"`
}

type SuperPod struct {
	SuperPodID string           `json:"super_pod_id"`
	ServerList []SuperPodServer `json:"server_list"`
}

type RankTableV12 struct {
	RankTable
	SuperPodList []SuperPod `json:"super_pod_list"`
}

func configuration(text string) (string, error) {
	var instance Instance
	if err := strictjson.Decode(text, &instance); err != nil {
		return "", fmt.Errorf("configuration: %v", err)
	}
	if len(instance.Devices) == 0 {
		return "", fmt.Errorf("configuration: no devices")
	}
	sdids := 0
	for _, device := range instance.Devices {
		if device.DeviceIP == "-1" {
			return "", fmt.Errorf("configuration: device %s has device_ip -1", device.DeviceID)
		}
		if _, err := strconv.Atoi(device.DeviceID); err != nil {
			return "", fmt.Errorf("configuration: device_id %q", device.DeviceID)
		}
		if device.SuperDeviceID != "" {
			sdids++
		}
	}
	return fmt.Sprintf("devices=%d sdids=%d host_ip=%s", len(instance.Devices), sdids, instance.HostIP), nil
}

func hccl(text, version string) (string, error) {
	var table RankTable
	var again []byte
	var err error
	superPods := 0
	switch version {
	case "1.0":
		if err = strictjson.Decode(text, &table); err != nil {
			return "", fmt.Errorf("hccl.json v1.0: %v", err)
		}
		again, err = json.Marshal(table)
	case "1.2":
		var v12 RankTableV12
		if err = strictjson.Decode(text, &v12); err != nil {
			return "", fmt.Errorf("hccl.json v1.2: %v", err)
		}
		table, superPods = v12.RankTable, len(v12.SuperPodList)
		again, err = json.Marshal(v12)
	default:
		return "", fmt.Errorf("no hccl.json version %q", version)
	}
	if err != nil {
		return "", err
	}
	// Go writes the same bytes: the keys in the types' order, the same encoding.
	if !bytes.Equal(again, []byte(text)) {
		return "", fmt.Errorf("Go marshals the table as %s", again)
	}
	if table.Version != version {
		return "", fmt.Errorf("version %q, not %s", table.Version, version)
	}
	if count, err := strconv.Atoi(table.ServerCount); err != nil || count != len(table.ServerList) {
		return "", fmt.Errorf("server_count %q for %d servers", table.ServerCount, len(table.ServerList))
	}
	devices := 0
	for _, server := range table.ServerList {
		for _, device := range server.Device {
			rank, err := strconv.Atoi(device.RankID)
			if err != nil || rank != devices {
				return "", fmt.Errorf("rank_id %q where %d comes next", device.RankID, devices)
			}
			if (device.SuperDeviceID != "") != (version == "1.2") {
				return "", fmt.Errorf("device %s: super_device_id %q in v%s", device.DeviceID, device.SuperDeviceID, version)
			}
			devices++
		}
	}
	return fmt.Sprintf("servers=%d devices=%d super_pods=%d", len(table.ServerList), devices, superPods), nil
}

func run() (string, error) {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		return "", err
	}
	var input struct {
		Configuration string `json:"configuration"`
		HCCL          string `json:"hccl"`
		Version       string `json:"version"`
	}
	if err := strictjson.Decode(string(raw), &input); err != nil {
		return "", fmt.Errorf("input: %v", err)
	}
	parts := []string{"ok"}
	if input.Configuration != "" {
		found, err := configuration(input.Configuration)
		if err != nil {
			return "", err
		}
		parts = append(parts, found)
	}
	if input.HCCL != "" {
		found, err := hccl(input.HCCL, input.Version)
		if err != nil {
			return "", err
		}
		parts = append(parts, found)
	}
	return strings.Join(parts, " "), nil
}

func main() {
	out, err := run()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(out)
}
