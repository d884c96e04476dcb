package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/client"
)

func render(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(jsonView(v))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestJSONViewAPINames: the SDK's structs print with the API's snake_case
// names, durations and times in the API's forms, no null anywhere.
func TestJSONViewAPINames(t *testing.T) {
	created := time.Date(2026, 12, 1, 12, 0, 0, 500, time.UTC)
	info := client.Info{ID: "sb-1", NodeID: "n1", State: client.StateRunning,
		Resources:   client.Resources{CPUMillis: 500, MemoryBytes: 256 << 20},
		IdleTimeout: 90 * time.Second, MaxLifetime: 250 * time.Millisecond, CreatedAt: created}
	got := render(t, info)
	for _, want := range []string{`"id":"sb-1"`, `"node_id":"n1"`, `"state":"running"`, `"cpu_millis":500`,
		`"memory_bytes":268435456`, `"idle_timeout":"90s"`, `"max_lifetime":"0.25s"`,
		`"created_at":"2026-12-01T12:00:00.0000005Z"`, `"env":[]`, `"labels":{}`} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %s in %s", want, got)
		}
	}
	for _, bad := range []string{"null", `"ID"`, `"NodeID"`, `"MemoryBytes"`, "last_active_at", "lazy_reads"} {
		if strings.Contains(got, bad) {
			t.Errorf("%s in %s", bad, got)
		}
	}
}

func TestJSONViewEmptyLists(t *testing.T) {
	for v, want := range map[any]string{
		"images":    `{"built":[],"compositions":[],"layers":[]}`,
		"sandboxes": `[]`,
	} {
		var in any = client.Images{}
		if v == "sandboxes" {
			in = []client.Info(nil)
		}
		if got := render(t, in); got != want {
			t.Errorf("%s: got %s, want %s", v, got, want)
		}
	}
}

// TestJSONViewTagsWin: a struct with its own json tags (bench results)
// keeps them.
func TestJSONViewTagsWin(t *testing.T) {
	type res struct {
		P50     float64  `json:"create_ready_p50_ms"`
		Skipped string   `json:"skipped,omitempty"`
		Hidden  int      `json:"-"`
		List    []string `json:"list"`
	}
	if got, want := render(t, res{P50: 1.5}), `{"create_ready_p50_ms":1.5,"list":[]}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestSnakeCase(t *testing.T) {
	for in, want := range map[string]string{"ID": "id", "NodeID": "node_id", "CPUMillis": "cpu_millis",
		"SandboxIDs": "sandbox_ids", "OOMKilled": "oom_killed", "BurstOK": "burst_ok", "TTL": "ttl",
		"HitRate": "hit_rate", "IDs": "ids", "P50Ms": "p50_ms"} {
		if got := snakeCase(in); got != want {
			t.Errorf("snakeCase(%s) = %s, want %s", in, got, want)
		}
	}
}
