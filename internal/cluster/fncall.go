package cluster

import (
	"context"
	"errors"
	"syscall"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
)

// FnCalls is a control instance's FnCallService: a call holds no state
// between requests, so each goes to a node placed like a create (its
// memory counted while in flight only), retried elsewhere on a refusal.
type FnCalls struct{ P *Proxy }

var _ corralv1connect.FnCallServiceHandler = FnCalls{}

func (f FnCalls) client(v *NodeView) corralv1connect.FnCallServiceClient {
	return corralv1connect.NewFnCallServiceClient(f.P.http, f.P.url(v),
		connect.WithInterceptors(ClientInterceptor{Secret: f.P.cfg.Secret}))
}

// fnPlace runs call on a node, at most MaxAttempts nodes in all.
func fnPlace[Resp any](f FnCalls, memory int64, call func(corralv1connect.FnCallServiceClient) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	refused := map[string]string{}
	for range f.P.cfg.MaxAttempts {
		pl, err := f.P.cfg.Placer.Place(Want{Backend: "container", MemoryBytes: memory}, refused)
		if err != nil {
			return nil, err
		}
		resp, err := call(f.client(pl.Node))
		pl.Done(false)
		if err == nil {
			return resp, nil
		}
		if connect.CodeOf(err) == connect.CodeResourceExhausted || errors.Is(err, syscall.ECONNREFUSED) {
			refused[pl.Node.ID] = connectMessage(err)
			continue
		}
		return nil, unreachable(pl.Node, err)
	}
	return nil, noNode(refused)
}

func (f FnCalls) Call(ctx context.Context, req *connect.Request[corralv1.CallRequest]) (*connect.Response[corralv1.CallResponse], error) {
	return fnPlace(f, req.Msg.GetMemoryLimitBytes(), func(c corralv1connect.FnCallServiceClient) (*connect.Response[corralv1.CallResponse], error) {
		return c.Call(ctx, connect.NewRequest(req.Msg))
	})
}

// CallBatch sends the whole batch to one node (its pools serve it).
func (f FnCalls) CallBatch(ctx context.Context, req *connect.Request[corralv1.CallBatchRequest]) (*connect.Response[corralv1.CallBatchResponse], error) {
	var memory int64
	for _, c := range req.Msg.GetCalls() {
		memory += c.GetMemoryLimitBytes()
	}
	return fnPlace(f, memory, func(c corralv1connect.FnCallServiceClient) (*connect.Response[corralv1.CallBatchResponse], error) {
		return c.CallBatch(ctx, connect.NewRequest(req.Msg))
	})
}
