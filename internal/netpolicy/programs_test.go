package netpolicy

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

var update = flag.Bool("update", false, "rewrite testdata/programs.golden")

// TestProgramsGolden renders every program, disassembled with map names
// for file descriptors, so that a reviewer sees each change to the
// enforcement as a diff of testdata/programs.golden.
func TestProgramsGolden(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create the maps the programs reference")
	}
	m, err := newMaps()
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	names := map[string]string{
		fmt.Sprint(m.allow.FD()): "allow", fmt.Sprint(m.flows.FD()): "flows",
		fmt.Sprint(m.refused.FD()): "refused", fmt.Sprint(m.total.FD()): "total",
	}
	fd := regexp.MustCompile(`fd: (\d+)`)
	var b strings.Builder
	for _, k := range progKinds {
		insns := sockAddrProgram(m, k.v6, k.hook)
		if k.hook == hookEgress {
			insns = egressProgram(m)
		}
		fmt.Fprintf(&b, "== %s (%s, %s): %d instructions\n", k.name, k.typ, k.attach, len(insns))
		text := fd.ReplaceAllStringFunc(fmt.Sprint(insns), func(s string) string {
			return "map: " + names[fd.FindStringSubmatch(s)[1]]
		})
		b.WriteString(text)
	}
	// The microVM tc program, for a fixed guest; it must also pass the
	// verifier (it is loaded only when a microVM gets a network).
	g := guestIdentity{MAC: guestMAC(7), Addr4: netip.MustParseAddr("10.88.0.7"), Addr6: netip.MustParseAddr("fd88::7"),
		NetnsMAC: net.HardwareAddr{0x0a, 1, 2, 3, 4, 5}}
	insns := tapProgram(m, g)
	fmt.Fprintf(&b, "== %s (%s, %s) for %s %s %s: %d instructions\n", tapProgramName, ebpf.SchedCLS, ebpf.AttachTCXIngress, g.MAC, g.Addr4, g.Addr6, len(insns))
	b.WriteString(fd.ReplaceAllStringFunc(fmt.Sprint(insns), func(s string) string {
		return "map: " + names[fd.FindStringSubmatch(s)[1]]
	}))
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: tapProgramName, Type: ebpf.SchedCLS, Instructions: insns, License: "Apache-2.0"})
	if err != nil {
		t.Fatalf("load %s: %+v", tapProgramName, err)
	}
	p.Close()
	got := b.String()
	path := filepath.Join("testdata", "programs.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestProgramsGolden -update)", err)
	}
	if got != string(want) {
		t.Errorf("programs changed: review and run go test ./internal/netpolicy -run TestProgramsGolden -update\n%s", got)
	}
}
