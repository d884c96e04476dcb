package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/server"
)

// TestClusterFlags: bad cluster flags are refused naming the flag, before
// anything starts.
func TestClusterFlags(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(t.TempDir(), "good")
	if err := os.WriteFile(good, []byte("a-secret-of-enough-bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f    clusterFlags
		want string
	}{
		{clusterFlags{role: "node"}, "--cluster-secret-file"},
		{clusterFlags{role: "node", secretFile: secret}, "at least 16"},
		{clusterFlags{role: "node", secretFile: good, labels: []string{"novalue"}}, "--node-label"},
		{clusterFlags{role: "node", secretFile: good, capMemory: "lots"}, "capacity-memory"},
		{clusterFlags{role: "node", tlsCert: good}, "give all three"},
		{clusterFlags{role: "node", tlsCert: good, tlsKey: good, tlsCA: good}, "cluster TLS certificate"},
	} {
		if _, err := c.f.nodeConfig(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.f, err, c.want)
		}
	}
	nc, err := (&clusterFlags{role: "node", secretFile: good, labels: []string{"pool=burst", "gpu=true"}, capMemory: "8Gi"}).nodeConfig()
	if err != nil || nc.Labels["pool"] != "burst" || nc.Capacity.MemoryBytes != 8<<30 || string(nc.Secret) != "a-secret-of-enough-bytes" {
		t.Fatalf("node config: %+v, %v", nc, err)
	}
	if _, err := (&clusterFlags{role: "edge"}).start(context.Background(), server.Config{}); err == nil || !strings.Contains(err.Error(), "--role") {
		t.Errorf("unknown role: %v", err)
	}
	if err := (&clusterFlags{role: "control", secretFile: good}).runControl(context.Background(), "", "", nil); err == nil || !strings.Contains(err.Error(), "--etcd") {
		t.Errorf("control without --etcd: %v", err)
	}
}
