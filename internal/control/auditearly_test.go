package control

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// runUntilLogged is a SandboxService whose Run succeeds only once its own
// audit entry is in the store (it waits up to 5 s), and fails for sandbox
// "bad".
type runUntilLogged struct {
	corralv1connect.UnimplementedSandboxServiceHandler
	svc *iam.Service
}

func (h runUntilLogged) Run(ctx context.Context, req *connect.Request[corralv1.ExecRequest]) (*connect.Response[corralv1.RunResponse], error) {
	id := req.Msg.SandboxId
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		entries, err := h.svc.ListAudit(ctx, iam.Principal{NodeAdmin: true}, iam.AuditFilter{})
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if strings.Contains(e.Summary, id) {
				if id == "bad" {
					return nil, errdefs.NotFound("sandbox bad: not found")
				}
				return connect.NewResponse(&corralv1.RunResponse{}), nil
			}
		}
	}
	return nil, errors.New("the audit entry was not written while the call ran")
}

// TestExecAuditWrittenWhileItRuns: an exec's audit entry reaches the store
// while the exec runs (so its sync overlaps the command), ends with the
// call's own result, and a failed exec's entry says how it failed.
func TestExecAuditWrittenWhileItRuns(t *testing.T) {
	st, err := iam.OpenBolt(filepath.Join(t.TempDir(), "iam.db"))
	if err != nil {
		t.Fatal(err)
	}
	svc := iam.New(iam.Config{Store: st})
	defer svc.Close()
	g := &Guard{IAM: svc}
	path, h := corralv1connect.NewSandboxServiceHandler(runUntilLogged{svc: svc}, connect.WithInterceptors(ErrorInterceptor{}, g))
	mux := http.NewServeMux()
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(NodeAdminContext(r.Context())))
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := corralv1connect.NewSandboxServiceClient(srv.Client(), srv.URL)
	ctx := context.Background()

	if _, err := c.Run(ctx, connect.NewRequest(&corralv1.ExecRequest{SandboxId: "good", Argv: []string{"true"}})); err != nil {
		t.Fatalf("run: %v", err)
	}
	if _, err := c.Run(ctx, connect.NewRequest(&corralv1.ExecRequest{SandboxId: "bad", Argv: []string{"true"}})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("run in bad: %v, want NotFound", err)
	}
	entries, err := svc.ListAudit(ctx, iam.Principal{NodeAdmin: true}, iam.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		if e.Procedure != corralv1connect.SandboxServiceRunProcedure {
			t.Errorf("entry of %s", e.Procedure)
		}
		got[e.Summary] = e.Result
	}
	if len(got) != 2 || got[`sandbox_id="good"`] != "ok" || !strings.HasPrefix(got[`sandbox_id="bad"`], "not_found") {
		t.Errorf("audit log %v; want good ok and bad not_found, one entry each", got)
	}
}
