package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
)

// ProxyConfig configures a control instance's SandboxService.
type ProxyConfig struct {
	Watcher *Watcher
	Placer  *Placer
	Secret  Secret
	// TLS, when set, is mutual TLS to the nodes (HTTP/2 over TLS instead
	// of h2c).
	TLS *TLS
	// MaxAttempts bounds the nodes one create is offered to (default 3).
	MaxAttempts int
	// OnPlace, when set, is told how long each placement decision took
	// (benchmarks).
	OnPlace func(time.Duration)
	// Claims, when set, dedupes creates carrying a client request id
	// across control instances.
	Claims *Claims
	// Quotas, when set, returns a project's quota and its ancestors'
	// (project first), which placement checks against the cluster's usage.
	Quotas func(ctx context.Context, project string) ([]ProjectQuota, error)
	Logger *slog.Logger
}

// Proxy is the SandboxService of a control instance: Create places the
// sandbox and sends it to the chosen node; every other call goes to the
// node named in the sandbox id. It keeps no per-sandbox state.
type Proxy struct {
	cfg  ProxyConfig
	http *http.Client
	// scheme is "http://" (h2c) or "https://" (mutual TLS).
	scheme string

	mu      sync.Mutex
	clients map[string]nodeClient // node id -> client for its current address
}

type nodeClient struct {
	addr string
	corralv1connect.SandboxServiceClient
	rollout   corralv1connect.RolloutServiceClient
	migration corralv1connect.MigrationServiceClient
}

var _ corralv1connect.SandboxServiceHandler = (*Proxy)(nil)

// NewProxy builds the proxy.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols:           protocols,
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		HTTP2:               &http.HTTP2Config{PingTimeout: 5 * time.Second, SendPingTimeout: 5 * time.Second},
	}
	scheme := "http://"
	if cfg.TLS != nil {
		protocols = new(http.Protocols)
		protocols.SetHTTP2(true)
		tr.Protocols, tr.TLSClientConfig = protocols, cfg.TLS.ClientConfig()
		scheme = "https://"
	}
	return &Proxy{cfg: cfg, http: &http.Client{Transport: tr}, scheme: scheme, clients: map[string]nodeClient{}}
}

// url is node v's base URL.
func (p *Proxy) url(v *NodeView) string { return p.scheme + v.Address }

// Close drops the connections to nodes.
func (p *Proxy) Close() { p.http.CloseIdleConnections() }

func (p *Proxy) client(v *NodeView) corralv1connect.SandboxServiceClient {
	return p.nodeClient(v).SandboxServiceClient
}

// signed makes a client's calls signed with the cluster secret, as a
// node's cluster listener requires.
func (p *Proxy) signed() connect.ClientOption {
	return connect.WithInterceptors(ClientInterceptor{Secret: p.cfg.Secret})
}

func (p *Proxy) nodeClient(v *NodeView) nodeClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clients[v.ID]
	if !ok || c.addr != v.Address {
		sign := p.signed()
		c = nodeClient{addr: v.Address,
			SandboxServiceClient: corralv1connect.NewSandboxServiceClient(p.http, p.url(v), sign),
			rollout:              corralv1connect.NewRolloutServiceClient(p.http, p.url(v), sign),
			migration:            corralv1connect.NewMigrationServiceClient(p.http, p.url(v), sign)}
		p.clients[v.ID] = c
	}
	return c
}

// nodeFor is the node owning sandbox id: Unavailable (naming the node and
// why) when it is lost, NotFound when no such node ever registered.
func (p *Proxy) nodeFor(id string) (*NodeView, corralv1connect.SandboxServiceClient, error) {
	nodeID, err := nodeOf(id)
	if err != nil {
		return nil, nil, err
	}
	if to, ok := p.cfg.Watcher.MovedTo(id); ok {
		nodeID = to // migrated (moves.go)
	}
	v := p.cfg.Watcher.Snapshot().Node(nodeID)
	if v == nil {
		return nil, nil, errdefs.NotFound("sandbox %s: no node %s in the cluster", id, nodeID)
	}
	if v.State == NodeLost {
		return v, nil, errdefs.Unavailable("sandbox %s: %s", id, v.Reason)
	}
	return v, p.client(v), nil
}

// nodeOf is the node id in a sandbox id (<node>-<hex>).
func nodeOf(id string) (string, error) {
	nodeID, rest, ok := strings.Cut(id, "-")
	if !ok || nodeID == "" || rest == "" || len(id) > 128 {
		return "", errdefs.InvalidArgument("id: %q is not a sandbox id (want <node>-<hex>)", id)
	}
	return nodeID, nil
}

// unreachable turns a transport failure into Unavailable naming the node.
func unreachable(v *NodeView, err error) error {
	if err == nil {
		return nil
	}
	if connect.CodeOf(err) == connect.CodeUnavailable {
		return errdefs.Unavailable("node %s (%s): %v", v.ID, v.Address, err)
	}
	return err
}

func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Create places the sandbox: the chosen node admits it or refuses
// (ResourceExhausted), and a refused create is offered to another node, at
// most MaxAttempts in all. A retry (placement.retry) first looks for the
// sandbox an earlier attempt of the same request id made.
func (p *Proxy) Create(ctx context.Context, req *connect.Request[corralv1.CreateRequest]) (*connect.Response[corralv1.CreateResponse], error) {
	m := req.Msg
	if m.Placement == nil {
		m.Placement = &corralv1.Placement{}
	}
	given := m.Placement.RequestId != ""
	if !given {
		m.Placement.RequestId = newRequestID()
	} else if len(m.Placement.RequestId) > 128 {
		return nil, errdefs.InvalidArgument("placement.request_id: %d bytes, at most 128", len(m.Placement.RequestId))
	}
	if m.Placement.Retry {
		if sb, err := p.findRequest(ctx, m.Placement.RequestId); err != nil || sb != nil {
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(&corralv1.CreateResponse{Sandbox: sb}), nil
		}
	}
	want := Want{
		Backend:     m.Backend,
		CPUMillis:   m.GetResources().GetCpuMillis(),
		MemoryBytes: m.GetResources().GetMemoryBytes(),
		NodeLabels:  m.Placement.NodeLabels,
		BurstOK:     m.Placement.BurstOk,
		DiskBytes:   m.GetResources().GetDiskBytes(),
	}
	if project := principalOf(ctx).Project; project != "" && p.cfg.Quotas != nil {
		qs, err := p.cfg.Quotas(ctx, project)
		if err != nil {
			return nil, err
		}
		for _, q := range qs {
			if q.Quota.Limits() {
				want.Project, want.Quotas = project, qs
				break
			}
		}
	}
	if k := m.Placement.SpreadByLabel; k != "" {
		v, ok := m.Labels[k]
		if !ok {
			return nil, errdefs.InvalidArgument("placement.spread_by_label: %q is not one of the sandbox's labels", k)
		}
		want.Spread = k + "=" + v
	}
	if given && p.cfg.Claims != nil {
		return p.createClaimed(ctx, m, want)
	}
	refused := map[string]string{}
	for range p.cfg.MaxAttempts {
		pl, err := p.place(want, refused)
		if err != nil {
			return nil, err
		}
		resp, err := p.client(pl.Node).Create(ctx, connect.NewRequest(m))
		pl.Done(err == nil)
		if err == nil {
			return connect.NewResponse(resp.Msg), nil
		}
		// Elsewhere only when this node surely made nothing: it refused,
		// or it could not be reached at all. A call that broke half way
		// may have made the sandbox: the client retries with its request
		// id instead.
		if surelyNothing(err) {
			refused[pl.Node.ID] = connectMessage(err)
			continue
		}
		return nil, unreachable(pl.Node, err)
	}
	return nil, noNode(refused)
}

// place is one placement decision, timed for OnPlace.
func (p *Proxy) place(want Want, refused map[string]string) (*Placement, error) {
	start := time.Now()
	pl, err := p.cfg.Placer.Place(want, refused)
	if p.cfg.OnPlace != nil {
		p.cfg.OnPlace(time.Since(start))
	}
	return pl, err
}

// surelyNothing reports whether a node's create error means it made
// nothing: it refused, or it could not be reached at all.
func surelyNothing(err error) bool {
	return connect.CodeOf(err) == connect.CodeResourceExhausted || errors.Is(err, syscall.ECONNREFUSED)
}

func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// findRequest asks every node for the sandbox made for request id rid. A
// node that cannot answer might hold it: then the retry fails Unavailable
// rather than risk a second sandbox.
func (p *Proxy) findRequest(ctx context.Context, rid string) (*corralv1.Sandbox, error) {
	snap := p.cfg.Watcher.Snapshot()
	type answer struct {
		sb  *corralv1.Sandbox
		err error
	}
	answers := make(chan answer, len(snap.Nodes))
	for _, v := range snap.Nodes {
		go func() {
			if v.State == NodeLost {
				answers <- answer{err: errdefs.Unavailable("request %s may have been created on %s", rid, v.Reason)}
				return
			}
			resp, err := p.client(v).List(ctx, connect.NewRequest(&corralv1.ListRequest{Labels: map[string]string{RequestIDLabel: rid}, PageSize: 1}))
			if err != nil {
				answers <- answer{err: errdefs.Unavailable("request %s: cannot ask node %s whether it made it: %v", rid, v.ID, err)}
				return
			}
			if len(resp.Msg.Sandboxes) > 0 {
				answers <- answer{sb: resp.Msg.Sandboxes[0]}
				return
			}
			answers <- answer{}
		}()
	}
	var errs []error
	var found *corralv1.Sandbox
	for range snap.Nodes {
		a := <-answers
		if a.sb != nil {
			found = a.sb
		}
		if a.err != nil {
			errs = append(errs, a.err)
		}
	}
	if found != nil {
		return found, nil
	}
	return nil, errors.Join(errs...)
}

// lostSandbox describes a sandbox of a lost node from its id alone.
func lostSandbox(id string, v *NodeView) *corralv1.Sandbox {
	return &corralv1.Sandbox{Id: id, NodeId: v.ID, State: corralv1.SandboxState_SANDBOX_STATE_LOST, StopReason: v.Reason}
}

func (p *Proxy) Get(ctx context.Context, req *connect.Request[corralv1.GetRequest]) (*connect.Response[corralv1.GetResponse], error) {
	v, c, err := p.nodeFor(req.Msg.Id)
	if v != nil && v.State == NodeLost {
		return connect.NewResponse(&corralv1.GetResponse{Sandbox: p.lostSandbox(ctx, req.Msg.Id, v)}), nil
	}
	if err != nil {
		return nil, err
	}
	resp, err := c.Get(ctx, connect.NewRequest(req.Msg))
	return resp, unreachable(v, err)
}

func (p *Proxy) Delete(ctx context.Context, req *connect.Request[corralv1.DeleteRequest]) (*connect.Response[corralv1.DeleteResponse], error) {
	v, c, err := p.nodeFor(req.Msg.Id)
	if errdefs.IsNotFound(err) {
		return connect.NewResponse(&corralv1.DeleteResponse{}), nil // idempotent
	}
	if err != nil {
		return nil, err
	}
	resp, err := c.Delete(ctx, connect.NewRequest(req.Msg))
	if err == nil {
		if f, ok := decodeFreed(resp.Header().Get(freedHeader)); ok {
			p.cfg.Placer.Freed(v.ID, f.Project, f.Usage)
		}
		if uerr := p.cfg.Watcher.Unmove(ctx, req.Msg.Id); uerr != nil {
			p.cfg.Logger.Warn("deleted sandbox keeps its route", "sandbox", req.Msg.Id, "err", uerr)
		}
	}
	return resp, unreachable(v, err)
}

// List walks the nodes in id order, each node's sandboxes in its own order,
// so a page token ("node id" + that node's token) stays valid while nodes
// come and go: a node gone since is skipped, one added after the token's
// node is reached in turn.
func (p *Proxy) List(ctx context.Context, req *connect.Request[corralv1.ListRequest]) (*connect.Response[corralv1.ListResponse], error) {
	m := req.Msg
	size := int(m.PageSize)
	if size < 0 || size > 1000 {
		return nil, errdefs.InvalidArgument("page_size: %d is out of range (allowed 0 to 1000)", size)
	}
	if size == 0 {
		size = 100
	}
	startNode, nodeTok, err := decodeListToken(m.PageToken)
	if err != nil {
		return nil, err
	}
	out := &corralv1.ListResponse{}
	onlyLost := m.State == corralv1.SandboxState_SANDBOX_STATE_LOST
	for _, v := range p.cfg.Watcher.Snapshot().Nodes {
		if v.ID < startNode {
			continue
		}
		tok := ""
		if v.ID == startNode {
			tok = nodeTok
		}
		if v.State == NodeLost {
			// It cannot be asked: its sandboxes, as its last summary
			// lists them, are lost (with any state filter but LOST,
			// none match).
			out.UnavailableNodes = append(out.UnavailableNodes, v.Reason)
			if m.State != corralv1.SandboxState_SANDBOX_STATE_UNSPECIFIED && !onlyLost {
				continue
			}
			if next := p.listLost(ctx, v, m.Labels, lostCursor(tok), size, out); next != "" {
				out.NextPageToken = encodeListToken(v.ID, lostTokenMark+next)
				return connect.NewResponse(out), nil
			}
			if len(out.Sandboxes) == size {
				out.NextPageToken = encodeListToken(v.ID+"\x00", "")
				return connect.NewResponse(out), nil
			}
			continue
		}
		if onlyLost {
			continue // a live node has no lost sandboxes
		}
		if strings.HasPrefix(tok, lostTokenMark) {
			// The node came back since the previous page: its own
			// order differs, so it is listed from its start (a
			// sandbox may repeat, none is left out).
			tok = ""
		}
		for {
			resp, err := p.client(v).List(ctx, connect.NewRequest(&corralv1.ListRequest{
				Labels: m.Labels, State: m.State, PageSize: int32(size - len(out.Sandboxes)), PageToken: tok,
			}))
			if err != nil {
				out.UnavailableNodes = append(out.UnavailableNodes, fmt.Sprintf("node %s (%s): %v", v.ID, v.Address, err))
				break
			}
			out.Sandboxes = append(out.Sandboxes, resp.Msg.Sandboxes...)
			tok = resp.Msg.NextPageToken
			if len(out.Sandboxes) == size {
				if tok != "" {
					out.NextPageToken = encodeListToken(v.ID, tok)
				} else {
					// Resume after this node.
					out.NextPageToken = encodeListToken(v.ID+"\x00", "")
				}
				return connect.NewResponse(out), nil
			}
			if tok == "" {
				break
			}
		}
	}
	return connect.NewResponse(out), nil
}

func encodeListToken(nodeID, tok string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(nodeID + "\n" + tok))
}

func decodeListToken(s string) (nodeID, tok string, err error) {
	if s == "" {
		return "", "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	nodeID, tok, ok := strings.Cut(string(raw), "\n")
	if err != nil || !ok {
		return "", "", errdefs.InvalidArgument("page_token: %q is not a token from a previous List", s)
	}
	return nodeID, tok, nil
}

func (p *Proxy) Exec(ctx context.Context, req *connect.Request[corralv1.ExecRequest], stream *connect.ServerStream[corralv1.ExecResponse]) error {
	return serverStream(p, ctx, req.Msg.SandboxId, req, stream, corralv1connect.SandboxServiceClient.Exec)
}

func (p *Proxy) ReadFile(ctx context.Context, req *connect.Request[corralv1.ReadFileRequest], stream *connect.ServerStream[corralv1.ReadFileResponse]) error {
	return serverStream(p, ctx, req.Msg.SandboxId, req, stream, corralv1connect.SandboxServiceClient.ReadFile)
}

// serverStream relays a per-sandbox server stream from the sandbox's node,
// message by message.
func serverStream[Req, Resp any](p *Proxy, ctx context.Context, id string, req *connect.Request[Req], out *connect.ServerStream[Resp],
	call func(corralv1connect.SandboxServiceClient, context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Resp], error)) error {
	v, c, err := p.nodeFor(id)
	if err != nil {
		return err
	}
	in, err := call(c, ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return unreachable(v, err)
	}
	return Relay(in, out, func(err error) error { return unreachable(v, err) })
}

// Relay copies a node's answer stream in to out message by message, then
// closes in; the node's error (in's) goes through nodeErr, out's as it is.
func Relay[T any](in *connect.ServerStreamForClient[T], out *connect.ServerStream[T], nodeErr func(error) error) error {
	defer in.Close()
	for in.Receive() {
		if err := out.Send(in.Msg()); err != nil {
			return err
		}
	}
	return nodeErr(in.Err())
}

// unary forwards one per-sandbox call to the sandbox's node.
func unary[Req, Resp any](p *Proxy, ctx context.Context, id string, req *connect.Request[Req],
	call func(corralv1connect.SandboxServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	v, c, err := p.nodeFor(id)
	if err != nil {
		return nil, err
	}
	resp, err := call(c, ctx, connect.NewRequest(req.Msg))
	return resp, unreachable(v, err)
}

func (p *Proxy) Run(ctx context.Context, req *connect.Request[corralv1.ExecRequest]) (*connect.Response[corralv1.RunResponse], error) {
	return unary(p, ctx, req.Msg.SandboxId, req, corralv1connect.SandboxServiceClient.Run)
}

func (p *Proxy) WriteFile(ctx context.Context, req *connect.Request[corralv1.WriteFileRequest]) (*connect.Response[corralv1.WriteFileResponse], error) {
	return unary(p, ctx, req.Msg.SandboxId, req, corralv1connect.SandboxServiceClient.WriteFile)
}

func (p *Proxy) ListDir(ctx context.Context, req *connect.Request[corralv1.ListDirRequest]) (*connect.Response[corralv1.ListDirResponse], error) {
	return unary(p, ctx, req.Msg.SandboxId, req, corralv1connect.SandboxServiceClient.ListDir)
}

func (p *Proxy) Stat(ctx context.Context, req *connect.Request[corralv1.StatRequest]) (*connect.Response[corralv1.StatResponse], error) {
	return unary(p, ctx, req.Msg.SandboxId, req, corralv1connect.SandboxServiceClient.Stat)
}

func (p *Proxy) Remove(ctx context.Context, req *connect.Request[corralv1.RemoveRequest]) (*connect.Response[corralv1.RemoveResponse], error) {
	return unary(p, ctx, req.Msg.SandboxId, req, corralv1connect.SandboxServiceClient.Remove)
}

func (p *Proxy) MakeDir(ctx context.Context, req *connect.Request[corralv1.MakeDirRequest]) (*connect.Response[corralv1.MakeDirResponse], error) {
	return unary(p, ctx, req.Msg.SandboxId, req, corralv1connect.SandboxServiceClient.MakeDir)
}

func (p *Proxy) Pause(ctx context.Context, req *connect.Request[corralv1.PauseRequest]) (*connect.Response[corralv1.PauseResponse], error) {
	return unary(p, ctx, req.Msg.Id, req, corralv1connect.SandboxServiceClient.Pause)
}

func (p *Proxy) Resume(ctx context.Context, req *connect.Request[corralv1.ResumeRequest]) (*connect.Response[corralv1.ResumeResponse], error) {
	return unary(p, ctx, req.Msg.Id, req, corralv1connect.SandboxServiceClient.Resume)
}

func (p *Proxy) UpdateNetwork(ctx context.Context, req *connect.Request[corralv1.UpdateNetworkRequest]) (*connect.Response[corralv1.UpdateNetworkResponse], error) {
	return unary(p, ctx, req.Msg.Id, req, corralv1connect.SandboxServiceClient.UpdateNetwork)
}

func (p *Proxy) NetworkStats(ctx context.Context, req *connect.Request[corralv1.NetworkStatsRequest]) (*connect.Response[corralv1.NetworkStatsResponse], error) {
	return unary(p, ctx, req.Msg.Id, req, corralv1connect.SandboxServiceClient.NetworkStats)
}

// ImagesFor is an ImageService client of the node owning sandbox id (Pack
// runs where the sandbox's writable layer is).
func (p *Proxy) ImagesFor(id string) (corralv1connect.ImageServiceClient, error) {
	v, _, err := p.nodeFor(id)
	if err != nil {
		return nil, err
	}
	return p.NodeImages(v), nil
}
