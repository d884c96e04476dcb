package control

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/corral-dev/corral/api/corral/v1"
)

// procedures lists every RPC of every corral.v1 service, from the
// registered descriptors, so new RPCs are covered without editing tests.
func procedures() []string {
	var out []string
	protoregistry.GlobalFiles.RangeFilesByPackage("corral.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				out = append(out, fmt.Sprintf("/%s/%s", sd.FullName(), sd.Methods().Get(j).Name()))
			}
		}
		return true
	})
	return out
}

// TestEveryProcedureHasARule: a new RPC must be classified (read, write,
// node only, IAM) before a token may call it; those naming a sandbox must
// say in which field.
func TestEveryProcedureHasARule(t *testing.T) {
	procs := procedures()
	if len(procs) < 30 {
		t.Fatalf("found only %d procedures: %v", len(procs), procs)
	}
	for _, p := range procs {
		if _, ok := rules[p]; !ok {
			t.Errorf("%s has no rule in guard.go", p)
		}
	}
	for p, r := range rules {
		if r.sandbox == "" {
			continue
		}
		found := false
		protoregistry.GlobalFiles.RangeFilesByPackage("corral.v1", func(fd protoreflect.FileDescriptor) bool {
			for i := range fd.Services().Len() {
				sd := fd.Services().Get(i)
				for j := range sd.Methods().Len() {
					m := sd.Methods().Get(j)
					if fmt.Sprintf("/%s/%s", sd.FullName(), m.Name()) == p {
						f := m.Input().Fields().ByName(protoreflect.Name(r.sandbox))
						found = f != nil && f.Kind() == protoreflect.StringKind
					}
				}
			}
			return true
		})
		if !found {
			t.Errorf("%s: rule names sandbox field %q, which its request lacks", p, r.sandbox)
		}
	}
}
