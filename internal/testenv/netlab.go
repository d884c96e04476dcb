package testenv

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
	"github.com/corral-dev/corral/internal/server"
)

// WithAgent gives a test server the microVM agent built with the other
// binaries, so that the microvm backend runs wherever QEMU and a guest
// kernel exist.
func WithAgent(t testing.TB) func(*server.Config) {
	bins := Binaries(t)
	return func(c *server.Config) { c.AgentBinary = filepath.Join(bins, "corral-agent") }
}

// NetLab makes a private test internet (netlab) that goes when the test
// ends.
func NetLab(t testing.TB) *netlab.Lab {
	t.Helper()
	RequireRoot(t)
	lab, err := netlab.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	return lab
}

// LabNetwork is sandbox networking with lab's node namespace as its node
// side and lab's DNS as upstream, on a bridge of its own named after
// prefix, with presets (nil: the defaults) and a pool of one.
func LabNetwork(lab *netlab.Lab, prefix string, presets map[string][]string) netpolicy.Config {
	return netpolicy.Config{
		Bridge:    UniqueName(prefix)[:11],
		NodeNetns: lab.NodePath,
		Upstreams: []string{netip.AddrPortFrom(netlab.DNS4, 53).String()},
		Presets:   presets,
		PoolSize:  1,
	}
}
