package netpolicy

import (
	"fmt"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestSlotNeverRemovesAnotherVeth: when the veth name of the index the pool
// picks already exists (a sandbox that outlived a restart and is not
// recovered yet), making the slot fails and leaves that veth alone.
func TestSlotNeverRemovesAnotherVeth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	ns, err := NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	m, err := NewManager(Config{NodeNetns: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns.Fd()), Bridge: "cbslot", PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.ensure(); err != nil {
		t.Fatal(err)
	}
	taken := m.vethName(2) // the first index the pool would pick
	la := netlink.NewLinkAttrs()
	la.Name = taken
	if err := m.node.nl.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "slot-peer"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.newSlot(); err == nil {
		t.Fatal("slot made over an existing veth name")
	}
	if _, err := m.node.nl.LinkByName(taken); err != nil {
		t.Errorf("the failed slot removed %s: %v", taken, err)
	}
	// With the index held, the pool moves on to the next one.
	m.mu.Lock()
	m.used[2] = true
	m.mu.Unlock()
	s, err := m.newSlot()
	if err != nil {
		t.Fatal(err)
	}
	if s.index != 3 {
		t.Errorf("slot index %d, want 3", s.index)
	}
	m.freeSlot(s)
	m.mu.Lock()
	delete(m.used, 2)
	m.mu.Unlock()
	if err := m.node.deleteLink(taken); err != nil {
		t.Fatal(err)
	}
}
