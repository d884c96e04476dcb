package lazy

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FaultEvent is one failed fetch, numbered so a watcher can ask for what
// came after the last one it saw.
type FaultEvent struct {
	Seq    uint64    `json:"seq"`
	Digest string    `json:"digest"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// maxFaults is how many fault events are kept for Faults.
const maxFaults = 256

type faultLog struct {
	mu     sync.Mutex
	seq    uint64
	events []FaultEvent
}

func (l *faultLog) add(digest, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	l.events = append(l.events, FaultEvent{Seq: l.seq, Digest: digest, Reason: reason, At: time.Now()})
	if len(l.events) > maxFaults {
		l.events = l.events[len(l.events)-maxFaults:]
	}
}

// Faults returns the failed fetches numbered after after, oldest first
// (the last maxFaults are kept): how a node outside this process learns
// which layers' sandboxes to mark degraded.
func (f *FS) Faults(after uint64) []FaultEvent {
	f.faults.mu.Lock()
	defer f.faults.mu.Unlock()
	var out []FaultEvent
	for _, e := range f.faults.events {
		if e.Seq > after {
			out = append(out, e)
		}
	}
	return out
}

// CgroupOf names pid's cgroup for Config.Attribute: its cgroup v2 path,
// or on a hybrid host where that is the root, its memory controller's
// path ("" when pid is gone). The node knows each sandbox's cgroup.
func CgroupOf(pid uint32) string {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/cgroup")
	if err != nil {
		return ""
	}
	var v2, memory string
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			memory = parts[2]
		}
	}
	if v2 != "" && v2 != "/" {
		return v2
	}
	return memory
}
