package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestVMTableAgentRow: the corral-agent row sits beside qemu-ga's with
// the ratio of the same run, and says n/a for an image without the agent.
func TestVMTableAgentRow(t *testing.T) {
	var b bytes.Buffer
	r := &VMResult{Image: "debian@12", ExecP50Ms: 211.4, AgentExecP50Ms: 38.4, RatioQGAVsAgent: 5.5, MicroVMExecP50Ms: 20.4}
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"via guest agent (qemu-ga)", "via corral-agent", "38.4 ms", "5.5"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	r = &VMResult{Image: "win@11", ExecP50Ms: 900}
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "n/a") {
		t.Errorf("no corral-agent: want n/a in its row:\n%s", b.String())
	}
}
