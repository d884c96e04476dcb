package server

import (
	"context"
	"io"
	"net/http"

	"connectrpc.com/connect"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/backend/vm"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/liveview"
)

// serveVM mounts VMService: VM images (when the node runs the vm
// backend) and the screens of vm sandboxes, and the live view's
// websocket. Disk imports stream large messages.
func (s *Server) serveVM(mux *http.ServeMux, sandboxes *control.Service, guard connect.HandlerOption) {
	var images control.VMImages // nil: no vm backend
	if s.stack.fullVM != nil {
		images = vmImages{s.stack.fullVM.Images()}
	}
	tokens := liveview.NewTokens()
	s.vmService = control.NewVMService(sandboxes, images, tokens)
	path, h := corralv1connect.NewVMServiceHandler(s.vmService, guard,
		connect.WithReadMaxBytes(80<<20))
	mux.Handle(path, h)
	// The live view's websocket: its one-time token is its credential
	// (a browser cannot send a bearer header on a websocket).
	s.liveView = &liveview.Handler{Open: liveview.Local(tokens, s.node.DialVNC), Logger: s.cfg.Logger}
	mux.Handle(liveview.PathPrefix, s.liveView)
}

// serveClusterVM mounts the same VMService and live view on a cluster
// node's listener, for control instances (every call signed).
func (s *Server) serveClusterVM(mux *http.ServeMux, secret cluster.Secret) {
	path, h := corralv1connect.NewVMServiceHandler(s.vmService, connect.WithInterceptors(control.ErrorInterceptor{}),
		connect.WithReadMaxBytes(80<<20))
	mux.Handle(path, cluster.RequireSigned(secret, h))
	mux.Handle(liveview.PathPrefix, cluster.RequireSigned(secret, s.liveView))
}

// vmImages serves the vm backend's image store to the API layer.
type vmImages struct{ *vm.Images }

func vmImage(im vm.Image) control.VMImage {
	return control.VMImage{Ref: im.Ref, Format: im.Format, Firmware: im.Firmware, Source: im.Source,
		VirtualSize: im.VirtualSize, FileSize: im.FileSize, Created: im.Created}
}

func (v vmImages) List() ([]control.VMImage, error) {
	all, err := v.Images.List()
	out := make([]control.VMImage, len(all))
	for i, im := range all {
		out[i] = vmImage(im)
	}
	return out, err
}

func (v vmImages) Import(ctx context.Context, ref, firmware string, r io.Reader) (control.VMImage, error) {
	im, err := v.Images.Import(ctx, ref, firmware, r)
	return vmImage(im), err
}

func (v vmImages) Build(ctx context.Context, recipe, ref string, progress func(string)) (control.VMImage, error) {
	im, err := v.Images.Build(ctx, recipe, ref, progress)
	return vmImage(im), err
}
