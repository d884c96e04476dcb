package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/netpolicy/netlab"
)

// newNetBackend is newBackend with networking whose node side is a lab's
// node namespace.
func newNetBackend(t *testing.T) (*Backend, *netlab.Lab) {
	t.Helper()
	lab, err := netlab.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	m, err := netpolicy.NewManager(netpolicy.Config{
		Bridge:    "cc-" + hex.EncodeToString(rnd[:]),
		NodeNetns: lab.NodePath,
		Upstreams: []string{netip.AddrPortFrom(netlab.DNS4, 53).String()},
		PoolSize:  1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b := newBackend(t)
	b.cfg.Network = m
	return b, lab
}

// TestNetworkedCreateFailureAtEachStep: a networked create that fails at
// any step leaves no veth, cgroup, run dir or process behind.
func TestNetworkedCreateFailureAtEachStep(t *testing.T) {
	b, lab := newNetBackend(t)
	allow := func(s *backend.Spec) {
		s.Network = backend.Network{Mode: "allowlist", Allow: []string{"198.18.1.10:80"}}
	}
	// One good create first: the node side is set up.
	sb := newSandbox(t, b, allow)
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { failStep = "" }()
	for _, st := range createSteps {
		failStep = st.Name
		spec := defaultSpec(newID(t))
		allow(&spec)
		if _, err := b.Create(context.Background(), spec); err == nil || !strings.Contains(err.Error(), st.Name) {
			t.Fatalf("step %s: want injected failure, got %v", st.Name, err)
		}
		assertGone(t, b, spec.ID, 0)
		// At most the pool's ready namespace and the one its filler
		// holds until there is room.
		ports, err := lab.SandboxVeths()
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) > 2 {
			t.Errorf("step %s: veths left: %v", st.Name, ports)
		}
	}
	failStep = ""
	spec := defaultSpec(newID(t))
	spec.Network = backend.Network{Mode: "allowlist", Allow: []string{"nosuch"}}
	if _, err := b.Create(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "network.allow[0]") {
		t.Errorf("unknown preset: %v", err)
	}
	assertGone(t, b, spec.ID, 0)
}
