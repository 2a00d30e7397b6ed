// Command deviceinfo-decode decodes what ascend-agent publishes for Volcano into the Go types of Huawei's
// ascend-for-volcano, written here from the published field names, strictly (DisallowUnknownFields), and checks
// the CheckCode with Go's own encoding/json.
//
// Input on stdin: {"DeviceInfoCfg": "...", "baseDeviceInfos": "..."}. Output: one line, "ok ..." with what was
// decoded, or "error: ..." and exit status 1.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"ascend-agent/interop/strictjson"
)

// NodeDeviceInfo and NodeDeviceInfoCache as ascend-for-volcano declares them.
type NodeDeviceInfo struct {
	DeviceList map[string]string
	UpdateTime int64
}

type NodeDeviceInfoCache struct {
	DeviceInfo  NodeDeviceInfo
	SuperPodID  int32
	ServerIndex int32
	CheckCode   string
	RackID      *int32 `json:"RackID,omitempty"`
}

// FaultTimeAndLevel and FaultDeviceInfo: one entry of a "<type>-Fault" list.
type FaultTimeAndLevel struct {
	FaultTime  int64  `json:"fault_time"`
	FaultLevel string `json:"fault_level"`
}

type FaultDeviceInfo struct {
	FaultType            string                       `json:"fault_type"`
	NPUName              string                       `json:"npu_name"`
	LargeModelFaultLevel string                       `json:"large_model_fault_level"`
	FaultLevel           string                       `json:"fault_level"`
	FaultHandling        string                       `json:"fault_handling"`
	FaultCode            string                       `json:"fault_code"`
	FaultTimeAndLevelMap map[string]FaultTimeAndLevel `json:"fault_time_and_level_map"`
}

// NpuBaseInfo: one value of the node annotation baseDeviceInfos.
type NpuBaseInfo struct {
	IP            string
	SuperDeviceID uint32
}

func run() (string, error) {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		return "", err
	}
	var input struct {
		DeviceInfoCfg   string
		BaseDeviceInfos string `json:"baseDeviceInfos"`
	}
	if err := strictjson.Decode(string(raw), &input); err != nil {
		return "", fmt.Errorf("input: %v", err)
	}
	var cache NodeDeviceInfoCache
	if err := strictjson.Decode(input.DeviceInfoCfg, &cache); err != nil {
		return "", fmt.Errorf("DeviceInfoCfg: %v", err)
	}
	marshalled, err := json.Marshal(cache.DeviceInfo)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(marshalled)
	if got := hex.EncodeToString(sum[:]); got != cache.CheckCode {
		return "", fmt.Errorf("CheckCode %s, Go computes %s", cache.CheckCode, got)
	}
	// Go writes the same bytes as the agent did: the whole cache, re-marshalled, is what was published.
	again, err := json.Marshal(cache)
	if err != nil {
		return "", err
	}
	if !bytes.Equal(again, []byte(input.DeviceInfoCfg)) {
		return "", fmt.Errorf("Go marshals the cache as %s", again)
	}
	faults := 0
	keys := make([]string, 0, len(cache.DeviceInfo.DeviceList))
	for key, value := range cache.DeviceInfo.DeviceList {
		keys = append(keys, key)
		if strings.HasSuffix(key, "-Fault") {
			var entries []FaultDeviceInfo
			if err := strictjson.Decode(value, &entries); err != nil {
				return "", fmt.Errorf("%s: %v", key, err)
			}
			faults += len(entries)
		}
	}
	sort.Strings(keys)
	var base map[string]NpuBaseInfo
	if err := strictjson.Decode(input.BaseDeviceInfos, &base); err != nil {
		return "", fmt.Errorf("baseDeviceInfos: %v", err)
	}
	return fmt.Sprintf("ok keys=%s faults=%d chips=%d", strings.Join(keys, ","), faults, len(base)), nil
}

func main() {
	out, err := run()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(out)
}
