package server

import (
	"context"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
)

// ClusterVMService is a control instance's VMService: screen, input and
// live view calls go to the sandbox's node; VM images are each node's
// own, so image calls go to the node they name (or the only node running
// the vm backend), and a listing without a node gathers every such
// node's. Each answer names its node.
type ClusterVMService struct{ proxy *cluster.Proxy }

var _ corralv1connect.VMServiceHandler = ClusterVMService{}

// onSandboxNode forwards a per-sandbox VMService call to the node of
// sandbox id; the node's errors name it.
func onSandboxNode[Req, Resp any](s ClusterVMService, ctx context.Context, id string, req *connect.Request[Req],
	call func(corralv1connect.VMServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("sandbox_id: required")
	}
	v, err := s.proxy.NodeOf(id)
	if err != nil {
		return nil, err
	}
	resp, err := call(s.proxy.NodeVMs(v), ctx, connect.NewRequest(req.Msg))
	return resp, onNode(v, err)
}

func (s ClusterVMService) Screenshot(ctx context.Context, req *connect.Request[corralv1.ScreenshotRequest]) (*connect.Response[corralv1.ScreenshotResponse], error) {
	return onSandboxNode(s, ctx, req.Msg.SandboxId, req, corralv1connect.VMServiceClient.Screenshot)
}

func (s ClusterVMService) SendInput(ctx context.Context, req *connect.Request[corralv1.SendInputRequest]) (*connect.Response[corralv1.SendInputResponse], error) {
	return onSandboxNode(s, ctx, req.Msg.SandboxId, req, corralv1connect.VMServiceClient.SendInput)
}

// LiveView asks the sandbox's node for the token; the viewer connects to
// the same path on this instance, which forwards it to the node.
func (s ClusterVMService) LiveView(ctx context.Context, req *connect.Request[corralv1.LiveViewRequest]) (*connect.Response[corralv1.LiveViewResponse], error) {
	return onSandboxNode(s, ctx, req.Msg.SandboxId, req, corralv1connect.VMServiceClient.LiveView)
}

func (s ClusterVMService) ListVMImages(ctx context.Context, req *connect.Request[corralv1.ListVMImagesRequest]) (*connect.Response[corralv1.ListVMImagesResponse], error) {
	nodes := s.proxy.VMNodes()
	if req.Msg.Node != "" {
		v, err := s.proxy.VMNode(req.Msg.Node)
		if err != nil {
			return nil, err
		}
		nodes = []*cluster.NodeView{v}
	}
	out := &corralv1.ListVMImagesResponse{}
	for _, v := range nodes {
		resp, err := s.proxy.NodeVMs(v).ListVMImages(ctx, connect.NewRequest(&corralv1.ListVMImagesRequest{Node: v.ID}))
		if err != nil {
			return nil, onNode(v, err)
		}
		out.Images = append(out.Images, resp.Msg.Images...)
	}
	return connect.NewResponse(out), nil
}

func (s ClusterVMService) ImportVMImage(ctx context.Context, in *connect.ClientStream[corralv1.ImportVMImageRequest]) (*connect.Response[corralv1.ImportVMImageResponse], error) {
	if !in.Receive() {
		if err := in.Err(); err != nil {
			return nil, err
		}
		return nil, errdefs.InvalidArgument("stream: no message")
	}
	first := in.Msg()
	v, err := s.proxy.VMNode(first.Node)
	if err != nil {
		return nil, err
	}
	first.Node = v.ID
	out := s.proxy.NodeVMs(v).ImportVMImage(ctx)
	if err := out.Send(first); err != nil {
		_, cerr := out.CloseAndReceive()
		return nil, onNode(v, cerr)
	}
	resp, err := relayUpload(in, out)
	return resp, onNode(v, err)
}

func (s ClusterVMService) BuildVMImage(ctx context.Context, req *connect.Request[corralv1.BuildVMImageRequest], out *connect.ServerStream[corralv1.BuildVMImageResponse]) error {
	v, err := s.proxy.VMNode(req.Msg.Node)
	if err != nil {
		return err
	}
	req.Msg.Node = v.ID
	in, err := s.proxy.NodeVMs(v).BuildVMImage(ctx, connect.NewRequest(req.Msg))
	return relay(v, in, err, out)
}

func (s ClusterVMService) RemoveVMImage(ctx context.Context, req *connect.Request[corralv1.RemoveVMImageRequest]) (*connect.Response[corralv1.RemoveVMImageResponse], error) {
	v, err := s.proxy.VMNode(req.Msg.Node)
	if err != nil {
		return nil, err
	}
	req.Msg.Node = v.ID
	resp, err := s.proxy.NodeVMs(v).RemoveVMImage(ctx, connect.NewRequest(req.Msg))
	return resp, onNode(v, err)
}
