package control

import (
	"context"
	"io"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/liveview"
)

// VMImages is the node's store of VM disk images (the vm backend's), as
// the API serves it; an interface so that this layer does not import the
// backend implementation.
type VMImages interface {
	List() ([]VMImage, error)
	Import(ctx context.Context, ref, firmware string, r io.Reader) (VMImage, error)
	Build(ctx context.Context, recipe, ref string, progress func(string)) (VMImage, error)
	Remove(ref string) error
}

// VMImage describes one VM image.
type VMImage struct {
	Ref, Format, Firmware, Source string
	VirtualSize, FileSize         int64
	Created                       time.Time
}

// VMService implements corral.v1.VMService: the node's VM images and the
// screen and input of vm sandboxes.
type VMService struct {
	sandboxes *Service
	images    VMImages // nil: the node runs no vm backend
	live      *liveview.Tokens
}

var _ corralv1connect.VMServiceHandler = (*VMService)(nil)

// NewVMService serves VM images from images (nil when the node has no vm
// backend) and screens of the sandboxes sandboxes routes to; LiveView
// issues its tokens into live, which the live view endpoint redeems.
func NewVMService(sandboxes *Service, images VMImages, live *liveview.Tokens) *VMService {
	return &VMService{sandboxes: sandboxes, images: images, live: live}
}

// store is the node's image store; node, when set, must name this node
// (a cluster's control instance sends each call to the node it names).
func (s *VMService) store(node string) (VMImages, error) {
	if local := s.sandboxes.local.ID(); node != "" && node != local {
		return nil, errdefs.NotFound("node %s: this server is node %s", node, local)
	}
	if s.images == nil {
		return nil, errdefs.NotSupported("vm images: this node runs no vm backend (it needs qemu-system-x86_64 and qemu-img)")
	}
	return s.images, nil
}

func (s *VMService) vmImageToProto(im VMImage) *corralv1.VMImage {
	return &corralv1.VMImage{Ref: im.Ref, Format: im.Format, Firmware: im.Firmware, VirtualSizeBytes: im.VirtualSize,
		FileSizeBytes: im.FileSize, Source: im.Source, CreatedUnix: im.Created.Unix(), Node: s.sandboxes.local.ID()}
}

func (s *VMService) ListVMImages(ctx context.Context, req *connect.Request[corralv1.ListVMImagesRequest]) (*connect.Response[corralv1.ListVMImagesResponse], error) {
	st, err := s.store(req.Msg.Node)
	if err != nil {
		return nil, err
	}
	all, err := st.List()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ListVMImagesResponse{Images: toProtos(all, s.vmImageToProto)}), nil
}

func (s *VMService) ImportVMImage(ctx context.Context, stream *connect.ClientStream[corralv1.ImportVMImageRequest]) (*connect.Response[corralv1.ImportVMImageResponse], error) {
	first, r, err := streamData(stream, func(m *corralv1.ImportVMImageRequest) []byte { return m.Data })
	if err != nil {
		return nil, err
	}
	st, err := s.store(first.Node)
	if err != nil {
		return nil, err
	}
	im, err := st.Import(ctx, first.Name, first.Firmware, r)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ImportVMImageResponse{Image: s.vmImageToProto(im)}), nil
}

func (s *VMService) BuildVMImage(ctx context.Context, req *connect.Request[corralv1.BuildVMImageRequest], stream *connect.ServerStream[corralv1.BuildVMImageResponse]) error {
	st, err := s.store(req.Msg.Node)
	if err != nil {
		return err
	}
	ref := req.Msg.Name
	if ref == "" {
		ref = "debian@12"
	}
	im, err := st.Build(ctx, req.Msg.Recipe, ref, func(line string) {
		_ = stream.Send(&corralv1.BuildVMImageResponse{Progress: line})
	})
	if err != nil {
		return err
	}
	return stream.Send(&corralv1.BuildVMImageResponse{Image: s.vmImageToProto(im)})
}

func (s *VMService) RemoveVMImage(ctx context.Context, req *connect.Request[corralv1.RemoveVMImageRequest]) (*connect.Response[corralv1.RemoveVMImageResponse], error) {
	st, err := s.store(req.Msg.Node)
	if err != nil {
		return nil, err
	}
	s.sandboxes.settle(ctx) // vm sandboxes deleted just before hold the image until their run dir goes
	if err := st.Remove(req.Msg.Ref); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.RemoveVMImageResponse{}), nil
}

func (s *VMService) Screenshot(ctx context.Context, req *connect.Request[corralv1.ScreenshotRequest]) (*connect.Response[corralv1.ScreenshotResponse], error) {
	n, err := s.sandboxes.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	shot, err := n.Screenshot(ctx, req.Msg.SandboxId, req.Msg.Scale)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.ScreenshotResponse{Png: shot.PNG, Width: int32(shot.Width), Height: int32(shot.Height)}), nil
}

func (s *VMService) SendInput(ctx context.Context, req *connect.Request[corralv1.SendInputRequest]) (*connect.Response[corralv1.SendInputResponse], error) {
	n, err := s.sandboxes.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	events := make([]backend.InputEvent, len(req.Msg.Events))
	for i, e := range req.Msg.Events {
		events[i] = backend.InputEvent{Text: e.Text, Keys: e.Keys, Move: e.Move, Click: e.Click, Scroll: e.Scroll,
			X: int(e.X), Y: int(e.Y), Button: e.Button, ScrollDelta: int(e.ScrollDelta)}
	}
	if err := n.SendInput(ctx, req.Msg.SandboxId, events); err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.SendInputResponse{}), nil
}

// LiveView checks that the sandbox's screen can be opened now (so that a
// caller learns of a missing screen here, not from the websocket) and
// issues a one-time token bound to it.
func (s *VMService) LiveView(ctx context.Context, req *connect.Request[corralv1.LiveViewRequest]) (*connect.Response[corralv1.LiveViewResponse], error) {
	if s.live == nil {
		return nil, errdefs.NotSupported("live view: not served by this server")
	}
	ttl, err := liveview.CheckTTL(time.Duration(req.Msg.TtlSeconds) * time.Second)
	if err != nil {
		return nil, err
	}
	n, err := s.sandboxes.route(req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	c, err := n.DialVNC(ctx, req.Msg.SandboxId)
	if err != nil {
		return nil, err
	}
	c.Close()
	token, expires, err := s.live.Issue(req.Msg.SandboxId, ttl)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&corralv1.LiveViewResponse{Path: liveview.Path(req.Msg.SandboxId), Token: token, ExpiresUnix: expires.Unix()}), nil
}
