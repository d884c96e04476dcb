package cluster

import (
	"context"
	"errors"
	"net/http"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
)

// TestRefusedConnectionIsRecognised: a create to a node whose port is
// closed is known to have made nothing (so it may go elsewhere); this
// relies on the Connect error wrapping the dial error.
func TestRefusedConnectionIsRecognised(t *testing.T) {
	c := corralv1connect.NewSandboxServiceClient(http.DefaultClient, "http://127.0.0.1:17599")
	_, err := c.Create(context.Background(), connect.NewRequest(&corralv1.CreateRequest{}))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("create to a closed port: %v; want it to wrap ECONNREFUSED", err)
	}
}
