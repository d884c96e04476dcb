package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "raw")
	// The file may appear late (the fw_cfg module loading): it is waited for.
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = os.WriteFile(p, []byte("c0ffee\n"), 0o400)
	}()
	if got, err := readSecret(p, 10*time.Second); err != nil || got != "c0ffee" {
		t.Errorf("readSecret: %q %v", got, err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := readSecret(empty, time.Second); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty secret: %v, want an error", err)
	}
	if _, err := readSecret(filepath.Join(dir, "none"), 200*time.Millisecond); err == nil {
		t.Error("missing secret file: no error")
	}
}

func TestServiceNeedsPortAndSecret(t *testing.T) {
	if err := Service(ServiceConfig{Port: "org.corral.agent.0"}); err == nil || !strings.Contains(err.Error(), "--secret-file") {
		t.Errorf("Service without a secret file: %v", err)
	}
}
