package main

import (
	"encoding/json"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// fields are an event's payload, beside its name ("event") and timestamp ("t").
type fields map[string]interface{}

// emitter writes each event as one JSON line, e.g.
//
//	{"event":"registered","resource":"huawei.com/Ascend910","t":81234567890123,...}
//
// "t" is CLOCK_MONOTONIC in ns, the clock of Python's time.monotonic_ns(), so the tests can compare it
// with their own readings.
type emitter struct {
	mu  sync.Mutex
	out *json.Encoder
}

func newEmitter(out io.Writer) *emitter {
	return &emitter{out: json.NewEncoder(out)}
}

func (e *emitter) emit(event string, payload fields) {
	record := fields{"event": event, "t": monotonicNs()}
	for key, value := range payload {
		record[key] = value
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.out.Encode(record); err != nil {
		// Nobody reads the events any more: the tests have gone.
		os.Exit(1)
	}
}

func monotonicNs() int64 {
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		panic(err)
	}
	return now.Nano()
}

// errorText is "" for nil, so events can carry an "error" field always.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
