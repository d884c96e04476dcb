package deptest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/corral-dev/corral/"

// A rule is one row of the import table: the package (a trailing "/..."
// also covers every package below), the corral packages it may import
// directly, and packages (corral or not) that must not be among its
// dependencies at any depth, but for the packages except names. Each row
// matches what the package's doc comment and docs/ARCHITECTURE.md say;
// change all three together.
type rule struct {
	pkg    string
	may    []string
	never  []string
	except []string
}

// Layers every lower package stays clear of, at any depth.
var (
	upper     = []string{"internal/server", "internal/cli", "internal/control", "internal/node", "api/...", "client"}
	stateful  = append([]string{"internal/state", "internal/iam/...", "internal/cluster/..."}, upper...)
	backends  = []string{"internal/backend/container", "internal/backend/microvm", "internal/backend/vm", "internal/fncall"}
	staticBad = []string{"google.golang.org/protobuf/...", "connectrpc.com/...", "github.com/spf13/...", "go.etcd.io/...", "github.com/prometheus/..."}
)

// sdkLeaves are the internal packages the SDK builds on: leaves that
// import nothing from corral.
var sdkLeaves = []string{"internal/wsconn"}

func cat(lists ...[]string) []string { return slices.Concat(lists...) }

var rules = []rule{
	// The leaves: nothing from corral.
	{pkg: "internal/errdefs"},
	{pkg: "internal/mountinfo"},
	{pkg: "internal/procfs"},
	{pkg: "internal/probeproto"},
	{pkg: "internal/wsconn"},
	{pkg: "internal/events"},
	{pkg: "internal/metrics"},
	{pkg: "internal/etcdembed"},
	{pkg: "internal/guest/initproto"},
	{pkg: "internal/guest/passwd"},
	{pkg: "internal/runtime/seccomp"},
	{pkg: "internal/deptest"},
	{pkg: "internal/redteam", may: []string{"internal/probeproto"}},
	{pkg: "api/...", may: []string{"api/..."}},
	{pkg: "internal/e2b/envdpb/...", may: []string{"internal/e2b/envdpb/..."}},

	// The SDK speaks the API and nothing internal.
	{pkg: "client", may: []string{"api/...", "internal/wsconn"}, never: []string{"internal/..."}, except: sdkLeaves},
	{pkg: "examples/...", may: []string{"client"}, never: []string{"internal/..."}, except: sdkLeaves},

	// Host id ranges; AsRoot's thread is never the leader.
	{pkg: "internal/runtime/userns", may: []string{"internal/runtime/osthread"}},

	// The sandbox-side programs: small static binaries.
	{pkg: "internal/runtime/spare", may: []string{}, never: staticBad},
	{pkg: "internal/runtime/osthread", may: []string{}, never: staticBad},
	{pkg: "internal/runtime/pidfd", may: []string{}, never: staticBad},
	{pkg: "internal/guest/exec", may: []string{"internal/errdefs", "internal/guest/passwd"}},
	{pkg: "internal/guest/init", may: []string{"internal/errdefs", "internal/guest/initproto", "internal/runtime/seccomp", "internal/guest/exec", "internal/runtime/spare", "internal/runtime/pidfd", "internal/runtime/osthread"},
		never: cat([]string{"net", "internal/backend"}, staticBad)},
	{pkg: "internal/guest/agentproto", may: []string{"internal/errdefs"}, never: staticBad},
	{pkg: "internal/guest/agent", may: []string{"internal/guest/agentproto", "internal/backend", "internal/errdefs", "internal/safefs", "internal/guest/exec"},
		never: cat(staticBad, stateful)},
	{pkg: "internal/guest/agentclient", may: []string{"internal/guest/agentproto", "internal/errdefs", "internal/backend"},
		never: cat(staticBad, stateful)},
	{pkg: "internal/runtime/spawner", may: []string{"internal/guest/initproto"}, never: cat([]string{"net"}, staticBad)},
	{pkg: "cmd/corral-init", may: []string{"internal/guest/init", "internal/runtime/spawner"}, never: cat([]string{"net"}, staticBad)},
	{pkg: "cmd/corral-agent", may: []string{"internal/guest/agent"}, never: staticBad},
	{pkg: "cmd/corral-probe", may: []string{"internal/probeproto"}, never: []string{"client", "api/..."}},

	// The runtime: processes, namespaces, cgroups; no backend above it.
	{pkg: "internal/runtime/cgroup", may: []string{"internal/mountinfo"}, never: cat([]string{"internal/backend/..."}, stateful)},
	{pkg: "internal/runtime/launch", may: []string{"internal/errdefs", "internal/runtime/cgroup", "internal/guest/initproto", "internal/runtime/userns", "internal/runtime/spawner", "internal/runtime/pidfd", "internal/runtime/osthread"},
		never: cat([]string{"internal/backend/..."}, stateful)},

	// Storage and files.
	{pkg: "internal/storage/upper/loopdev", may: []string{"internal/errdefs"}},
	{pkg: "internal/storage/blob", may: []string{"internal/errdefs"}},
	{pkg: "internal/storage/lazy", may: []string{"internal/storage/blob", "internal/errdefs"}},
	{pkg: "internal/seaweed", may: []string{"internal/storage/blob", "internal/errdefs"}},
	{pkg: "internal/storage/layers", may: []string{"internal/backend", "internal/storage/blob", "internal/errdefs", "internal/mountinfo"}, never: cat(backends, stateful)},
	{pkg: "internal/storage/share", may: []string{"internal/storage/blob", "internal/errdefs", "internal/storage/layers", "internal/storage/lazy"}, never: cat(backends, stateful)},
	// The writable layer: its type and store interface below every backend,
	// the stores beside it, the choice among them in upper/open.
	{pkg: "internal/storage/upper", may: []string{"internal/errdefs"}, never: cat([]string{"internal/backend/..."}, stateful)},
	{pkg: "internal/storage/upper/ext4img", may: []string{"internal/storage/upper", "internal/backend", "internal/errdefs", "internal/storage/upper/loopdev"}, never: cat(backends, stateful)},
	{pkg: "internal/storage/upper/xfs", may: []string{"internal/storage/upper", "internal/backend", "internal/errdefs", "internal/storage/upper/loopdev", "internal/mountinfo"}, never: cat(backends, stateful)},
	{pkg: "internal/storage/upper/open", may: []string{"internal/storage/upper", "internal/storage/upper/xfs", "internal/storage/upper/ext4img", "internal/errdefs"}, never: cat(backends, stateful)},
	{pkg: "internal/safefs", may: []string{"internal/backend", "internal/errdefs"}, never: cat(backends, stateful)},
	{pkg: "internal/importroot", may: []string{"internal/errdefs", "internal/safefs"}, never: cat(backends, stateful)},
	{pkg: "internal/boltfile", may: []string{"internal/errdefs"}, never: cat(backends, stateful)},
	{pkg: "internal/state", may: []string{"internal/errdefs", "internal/boltfile"}, never: cat([]string{"internal/backend/..."}, upper)},
	{pkg: "internal/execlog", may: []string{"internal/errdefs", "internal/boltfile"}, never: cat([]string{"internal/backend/..."}, upper)},
	{pkg: "internal/hostlimit", may: []string{"internal/errdefs", "internal/runtime/cgroup", "internal/runtime/spare"}, never: cat(backends, stateful)},
	{pkg: "internal/swaparea", may: []string{"internal/errdefs"}, never: cat(backends, stateful)},

	// The network policy drives the kernel; it knows the backend's types only.
	{pkg: "internal/netpolicy", may: []string{"internal/backend", "internal/errdefs", "internal/runtime/osthread"}, never: cat(backends, stateful)},
	{pkg: "internal/netpolicy/netlab", may: []string{"internal/netpolicy"}, never: cat(backends, stateful)},

	// The seam and the backends: never the node or anything above it.
	{pkg: "internal/backend", may: []string{"internal/errdefs"}, never: cat(backends, stateful)},
	{pkg: "internal/backend/backendtest", may: []string{"internal/backend", "internal/errdefs"}, never: cat(backends, stateful)},
	{pkg: "internal/backend/container", may: []string{"internal/backend", "internal/errdefs", "internal/storage/upper", "internal/storage/upper/loopdev", "internal/netpolicy", "internal/safefs",
		"internal/runtime/cgroup", "internal/guest/initproto", "internal/runtime/launch", "internal/runtime/seccomp", "internal/runtime/userns", "internal/runtime/osthread"},
		never: cat([]string{"internal/storage/layers", "internal/storage/blob", "internal/storage/lazy", "internal/storage/upper/xfs", "internal/storage/upper/ext4img", "internal/storage/upper/open"}, stateful)},
	{pkg: "internal/backend/microvm", may: []string{"internal/guest/agentclient", "internal/guest/agentproto", "internal/backend", "internal/backend/qemu", "internal/errdefs", "internal/netpolicy", "internal/qmp", "internal/runtime/launch"},
		never: cat([]string{"internal/storage/layers", "internal/storage/blob", "internal/storage/lazy", "internal/storage/upper/xfs", "internal/storage/upper/ext4img"}, stateful)},
	// The QEMU machine protocol client both QEMU backends drive.
	{pkg: "internal/qmp", may: []string{"internal/errdefs"}, never: cat(backends, stateful)},
	// The QEMU process, migration and snapshot files both QEMU backends share.
	{pkg: "internal/backend/qemu", may: []string{"internal/backend", "internal/errdefs", "internal/guest/agentclient", "internal/netpolicy", "internal/procfs", "internal/qmp", "internal/runtime/cgroup", "internal/runtime/launch"}, never: cat(backends, stateful)},
	{pkg: "internal/backend/vm/...", may: []string{"internal/backend", "internal/backend/qemu", "internal/errdefs", "internal/guest/agentclient", "internal/guest/agentproto", "internal/netpolicy", "internal/qmp", "internal/runtime/launch"},
		never: cat([]string{"internal/storage/layers", "internal/storage/blob", "internal/storage/lazy", "internal/storage/upper/xfs", "internal/storage/upper/ext4img"}, stateful)},
	{pkg: "internal/fncall", may: []string{"internal/backend", "internal/errdefs", "internal/storage/layers"}, never: stateful},

	// The node: records, lifecycle, routing, over the backend interface.
	{pkg: "internal/node", may: []string{"internal/backend", "internal/errdefs", "internal/events", "internal/storage/layers", "internal/execlog", "internal/metrics", "internal/netpolicy", "internal/state"},
		never: cat(backends, []string{"internal/server", "internal/cli", "internal/control", "api/...", "client", "internal/iam/...", "internal/cluster/..."})},

	// IAM and the cluster: no sandboxes.
	{pkg: "internal/iam", may: []string{"internal/errdefs", "internal/boltfile"}, never: cat([]string{"internal/node", "internal/backend/..."}, upper)},
	{pkg: "internal/iam/etcdstore", may: []string{"internal/errdefs", "internal/iam"}, never: cat([]string{"internal/node", "internal/backend/..."}, upper)},
	{pkg: "internal/iam/storetest", may: []string{"internal/errdefs", "internal/iam"}, never: cat([]string{"internal/node", "internal/backend/..."}, upper)},
	{pkg: "internal/cluster", may: []string{"api/...", "internal/errdefs", "internal/iam", "internal/liveview"},
		never: []string{"internal/node", "internal/backend/...", "internal/server", "internal/cli", "internal/control"}},
	{pkg: "internal/cluster/simnode", may: []string{"api/...", "internal/cluster", "internal/errdefs", "internal/iam"},
		never: []string{"internal/node", "internal/backend/...", "internal/server", "internal/cli", "internal/control"}},

	// The API layer.
	{pkg: "internal/control", may: []string{"api/...", "internal/backend", "internal/errdefs", "internal/events", "internal/fncall", "internal/iam",
		"internal/execlog", "internal/storage/layers", "internal/importroot", "internal/storage/share", "internal/metrics", "internal/node", "internal/state", "internal/liveview"},
		never: []string{"internal/server", "internal/cli", "client", "internal/backend/container", "internal/backend/microvm", "internal/backend/vm"}},
	// The live view's tokens and websocket relay: told how to dial.
	{pkg: "internal/liveview", may: []string{"internal/errdefs", "internal/wsconn"}, never: []string{"internal/node", "internal/backend/...", "internal/control", "internal/server", "internal/cli"}},
	{pkg: "internal/e2b", may: []string{"api/...", "internal/backend", "internal/control", "internal/e2b/envdpb/...", "internal/errdefs", "internal/iam", "internal/node", "internal/state"},
		never: []string{"internal/server", "internal/cli", "client"}},
	{pkg: "internal/ui", may: []string{"internal/control", "internal/events", "internal/iam"}, never: []string{"internal/server", "internal/cli"}},

	// The wiring and the front ends: may know everything below them.
	{pkg: "internal/server", may: []string{"..."}, never: []string{"internal/cli", "client", "internal/testenv", "internal/bench"}},
	{pkg: "internal/bench", may: []string{"client", "internal/storage/blob", "internal/cluster/...", "internal/etcdembed", "internal/storage/layers", "internal/storage/lazy", "internal/probeproto", "internal/procfs", "internal/seaweed", "internal/server"},
		never: []string{"internal/cli"}},
	{pkg: "internal/cli", may: []string{"..."}, never: []string{"internal/testenv"}},
	{pkg: "cmd/corral", may: []string{"internal/cli"}},
	{pkg: "internal/testenv/accept", may: []string{}},
	{pkg: "internal/testenv", may: []string{"client", "internal/mountinfo", "internal/procfs", "internal/runtime/cgroup", "internal/server", "internal/backend/vm", "internal/netpolicy", "internal/netpolicy/netlab"}},
	{pkg: "test/...", may: []string{"..."}},
}

// match reports whether path (relative to the module, or a standard or
// third-party path) is matched by pattern.
func match(pattern, path string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// external tells a pattern of a package outside the module (its first
// element has a dot, or it is a standard package such as "net") from one
// of the module's.
func external(pattern string) bool {
	first, _, _ := strings.Cut(pattern, "/")
	return strings.Contains(first, ".") || pattern == "net"
}

func ruleFor(pkg string) (rule, bool) {
	for _, r := range rules {
		if match(r.pkg, pkg) {
			return r, true
		}
	}
	return rule{}, false
}

type goPackage struct {
	Dir, ImportPath, Doc string
	Imports, Deps        []string
	GoFiles              []string
	TestGoFiles          []string
	XTestGoFiles         []string
}

var listed struct {
	sync.Once
	pkgs []goPackage
	err  error
}

// listPackages runs `go list` over the whole module once.
func listPackages(t *testing.T) []goPackage {
	t.Helper()
	listed.Do(func() { listed.pkgs, listed.err = goList() })
	if listed.err != nil {
		t.Fatal(listed.err)
	}
	return listed.pkgs
}

func goList() ([]goPackage, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	cmd := exec.Command("go", "list", "-e", "-json=Dir,ImportPath,Doc,Imports,Deps,GoFiles,TestGoFiles,XTestGoFiles", "./...")
	cmd.Dir = strings.TrimSpace(string(root))
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list ./...: %w", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 40 {
		return nil, fmt.Errorf("go list found %d packages; is this the corral module?", len(pkgs))
	}
	return pkgs, nil
}

func short(path string) (string, bool) {
	return strings.CutPrefix(path, module)
}

// TestImportRules: every package has a row; its direct corral imports
// are among the row's allowed ones, and none of the row's forbidden
// packages is among its dependencies at any depth.
func TestImportRules(t *testing.T) {
	for _, p := range listPackages(t) {
		name, _ := short(p.ImportPath)
		r, ok := ruleFor(name)
		if !ok {
			t.Errorf("%s: no row in internal/deptest's rules; add one (and its line in docs/ARCHITECTURE.md) saying what it may import", name)
			continue
		}
		for _, imp := range p.Imports {
			dep, own := short(imp)
			if !own || dep == name {
				continue
			}
			if !slices.ContainsFunc(r.may, func(m string) bool { return match(m, dep) }) {
				t.Errorf("%s imports %s, which its row does not allow (may: %v)", name, dep, r.may)
			}
		}
		for _, d := range p.Deps {
			dep, own := short(d)
			if slices.Contains(r.except, dep) {
				continue
			}
			for _, n := range r.never {
				if own != external(n) && match(n, dep) {
					t.Errorf("%s depends on %s (via %s), which its row forbids", name, dep, why(p, d))
				}
			}
		}
	}
}

// why names a direct import of p through which dependency d comes in (the
// first one that has d among its own dependencies), for the message.
func why(p goPackage, d string) string {
	if slices.Contains(p.Imports, d) {
		return "a direct import"
	}
	for _, imp := range p.Imports {
		deps, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", imp).Output()
		if err == nil && slices.Contains(strings.Fields(string(deps)), d) {
			return imp
		}
	}
	return "an import"
}

// TestEveryPackageHasADocComment: every package (test-only ones too) says
// what it is for in a doc comment.
func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.Doc != "" {
			continue
		}
		name, _ := short(p.ImportPath)
		files := slices.Concat(p.GoFiles, p.TestGoFiles, p.XTestGoFiles)
		documented := false
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc != nil && strings.TrimSpace(af.Doc.Text()) != "" {
				documented = true
				break
			}
		}
		if !documented {
			t.Errorf("%s: no package doc comment (say what it owns and what it must not import)", name)
		}
	}
}

// TestRulesNameRealPackages: a row for a package that no longer exists
// is a stale rule.
func TestRulesNameRealPackages(t *testing.T) {
	have := map[string]bool{}
	for _, p := range listPackages(t) {
		name, _ := short(p.ImportPath)
		have[name] = true
	}
	for _, r := range rules {
		if strings.HasSuffix(r.pkg, "...") {
			continue
		}
		if !have[r.pkg] {
			t.Errorf("row %s: no such package", r.pkg)
		}
	}
	if _, err := os.Stat("doc.go"); err != nil {
		t.Errorf("deptest's own doc: %v", err)
	}
}
