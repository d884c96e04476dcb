package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/server"
	"github.com/corral-dev/corral/internal/testenv"
)

// sdkDir holds the pinned e2b npm package (package-lock.json) and the
// compatibility script.
func sdkDir(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "test", "e2b")
}

// installSDK runs `npm ci` into test/e2b when its node_modules is missing.
func installSDK(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skip: %s is not installed (the test drives corral with the e2b npm package under node)", tool)
		}
	}
	if v, err := exec.Command("node", "-p", "JSON.stringify(process.versions.node.split('.').map(Number))").Output(); err == nil {
		var ver []int
		if json.Unmarshal(bytes.ReplaceAll(v, []byte("\n"), nil), &ver) == nil && len(ver) == 3 && (ver[0] < 20 || ver[0] == 20 && ver[1] < 18) {
			t.Skipf("skip: node %d.%d is older than the 20.18 the e2b SDK needs", ver[0], ver[1])
		}
	}
	dir := sdkDir(t)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err == nil {
		return dir
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return dir
}

func apiKey(t *testing.T) string {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "e2b_" + hex.EncodeToString(b)
}

// startE2B starts a server with the E2B API on a free port: its operator
// key and the API's URL.
func startE2B(t *testing.T) (key, url string) {
	key = apiKey(t)
	srv := testenv.StartServer(t, func(c *server.Config) {
		c.E2B = &server.E2BConfig{Listen: "127.0.0.1:0", APIKey: key}
	})
	return key, "http://" + srv.E2BAddr()
}

// TestE2BSDK drives the E2B API with the unchanged e2b SDK (npm e2b,
// pinned in test/e2b/package-lock.json): every case of test/e2b/compat.mjs
// is a subtest here.
func TestE2BSDK(t *testing.T) {
	dir := installSDK(t)
	key, url := startE2B(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "compat.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_TEMPLATE=busybox")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node compat.mjs: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	want := []string{"create", "run_output", "run_nonzero_exit", "run_env_cwd", "run_streams", "run_timeout",
		"background_list_kill", "background_connect", "stdin", "pty", "files_text_bytes", "user", "files_20mib",
		"files_ops", "watch_dir", "signed_url", "host_routing", "api_unreachable_inside", "get_info", "metrics", "list_filter_pages", "set_timeout",
		"pause_connect", "auto_pause", "concurrent_50", "wrong_api_key", "unknown_sandbox", "kill"}
	got := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r struct {
			Case  string `json:"case"`
			OK    bool   `json:"ok"`
			MS    int64  `json:"ms"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Errorf("unparsable line from compat.mjs: %q", sc.Text())
			continue
		}
		got[r.Case] = true
		t.Run(r.Case, func(t *testing.T) {
			if !r.OK {
				t.Errorf("%s (after %d ms)", r.Error, r.MS)
			}
		})
	}
	for _, c := range want {
		if !got[c] {
			t.Errorf("case %s did not run (stderr: %s)", c, stderr.String())
		}
	}
}
