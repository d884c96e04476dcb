package server

import (
	"net/http"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/backend/vm"
	"github.com/corral-dev/corral/internal/control"
)

// serveVM mounts VMService: VM images (when the node runs the vm
// backend) and the screens of vm sandboxes. Disk imports stream large
// messages.
func (s *Server) serveVM(mux *http.ServeMux, sandboxes *control.Service, guard connect.HandlerOption) {
	var images *vm.Images
	if s.stack.fullVM != nil {
		images = s.stack.fullVM.Images()
	}
	path, h := corralv1connect.NewVMServiceHandler(control.NewVMService(sandboxes, images), guard,
		connect.WithReadMaxBytes(80<<20))
	mux.Handle(path, h)
}
