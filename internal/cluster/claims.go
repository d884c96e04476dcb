package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Keys of request-id claims (outside clusterPrefix: nothing watches them).
const (
	// requestsPrefix holds one claim per client request id being (or
	// lately) created, under a window lease.
	requestsPrefix = "/corral/requests/"
	// controlsPrefix holds one key per live control instance, under its
	// keepalive lease: a claim whose owner key is gone has no owner.
	controlsPrefix = "/corral/controls/"
)

const (
	// claimWindow is how long a claim lives: a duplicate of a create
	// arriving later than this is deduped by the node alone (when it
	// lands on the same node).
	claimWindow = 10 * time.Minute
	// claimRotate is how often a new window lease is granted (each claim
	// lives claimWindow-claimRotate to claimWindow).
	claimRotate = time.Minute
	// ownerTTL is how soon a dead control instance's claims are taken over.
	ownerTTL = 5 * time.Second
)

// claimState says how far a claimed create got.
type claimState string

const (
	claimPlacing claimState = "placing" // sent (or being sent) to Node
	claimMade    claimState = "made"    // Node made Sandbox
)

// claim is the record of a create by client request id: which control
// instance places it (Owner, "" when none does any more) and on which node.
type claim struct {
	Owner   string     `json:"owner,omitempty"`
	Node    string     `json:"node"`
	State   claimState `json:"state"`
	Sandbox string     `json:"sandbox,omitempty"`
}

// Claims dedupes creates that carry the same client request id across
// control instances: the first instance to claim the id places it and
// records the node; any other instance (or goroutine) with the same id
// waits for it, or, once its owner is gone, sends the create to the
// recorded node, which dedupes by request id. The claims are in etcd, so
// no instance keeps per-create state of its own.
type Claims struct {
	cli *clientv3.Client
	// ID names this control instance in claims.
	ID    string
	owner clientv3.LeaseID
	stop  context.CancelFunc
	done  chan struct{}

	mu       sync.Mutex
	window   clientv3.LeaseID
	windowAt time.Time
}

// StartClaims registers this control instance (its key lives as long as
// it does, plus ownerTTL).
func StartClaims(ctx context.Context, cli *clientv3.Client) (*Claims, error) {
	c := &Claims{cli: cli, ID: newRequestID()[:12], done: make(chan struct{})}
	lease, err := cli.Grant(ctx, int64(ownerTTL/time.Second))
	if err != nil {
		return nil, fmt.Errorf("control instance: grant its lease: %w", err)
	}
	c.owner = lease.ID
	if _, err := cli.Put(ctx, controlsPrefix+c.ID, time.Now().UTC().Format(time.RFC3339), clientv3.WithLease(lease.ID)); err != nil {
		return nil, fmt.Errorf("control instance: register: %w", err)
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = cancel
	ka, err := cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("control instance: keep its lease alive: %w", err)
	}
	go func() {
		defer close(c.done)
		for range ka { // drained until kctx ends or the lease is lost
		}
	}()
	return c, nil
}

// Close unregisters the instance: its claims have no owner at once.
func (c *Claims) Close() {
	c.stop()
	<-c.done
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = c.cli.Revoke(ctx, c.owner)
}

// windowLease is the lease new claims are put under.
func (c *Claims) windowLease(ctx context.Context) (clientv3.LeaseID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.window != 0 && time.Since(c.windowAt) < claimRotate {
		return c.window, nil
	}
	l, err := c.cli.Grant(ctx, int64(claimWindow/time.Second))
	if err != nil {
		return 0, fmt.Errorf("request claims: grant a lease: %w", err)
	}
	c.window, c.windowAt = l.ID, time.Now()
	return l.ID, nil
}

// get is the claim of rid and its mod revision (nil, 0 when none).
func (c *Claims) get(ctx context.Context, rid string) (*claim, int64, error) {
	resp, err := c.cli.Get(ctx, requestsPrefix+rid)
	if err != nil {
		return nil, 0, fmt.Errorf("request %s: read its claim: %w", rid, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	cl := new(claim)
	if err := json.Unmarshal(resp.Kvs[0].Value, cl); err != nil {
		return nil, 0, fmt.Errorf("request %s: claim: %w", rid, err)
	}
	return cl, resp.Kvs[0].ModRevision, nil
}

// put writes cl for rid if its claim is still at revision rev (0: absent);
// it reports whether it did, and otherwise the claim found instead.
func (c *Claims) put(ctx context.Context, rid string, rev int64, cl claim) (bool, *claim, int64, error) {
	lease, err := c.windowLease(ctx)
	if err != nil {
		return false, nil, 0, err
	}
	key := requestsPrefix + rid
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, marshal(cl), clientv3.WithLease(lease))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return false, nil, 0, fmt.Errorf("request %s: claim: %w", rid, err)
	}
	if resp.Succeeded {
		return true, nil, resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return false, nil, 0, nil // gone meanwhile: the caller looks again
	}
	found := new(claim)
	if err := json.Unmarshal(kvs[0].Value, found); err != nil {
		return false, nil, 0, fmt.Errorf("request %s: claim: %w", rid, err)
	}
	return false, found, kvs[0].ModRevision, nil
}

// alive reports whether control instance id still holds its key.
func (c *Claims) alive(ctx context.Context, id string) (bool, error) {
	if id == "" {
		return false, nil
	}
	if id == c.ID {
		return true, nil
	}
	resp, err := c.cli.Get(ctx, controlsPrefix+id, clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("control instance %s: %w", id, err)
	}
	return resp.Count > 0, nil
}

// drop deletes rid's claim if it is still at revision rev (every node
// refused the create: nothing was made).
func (c *Claims) drop(ctx context.Context, rid string, rev int64) {
	key := requestsPrefix + rid
	_, _ = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
}

// claimPoll is how often a create waits to see its request's owner finish.
const claimPoll = 50 * time.Millisecond

// createClaimed places a create whose client named its request id, once
// across the control instances (see Claims).
func (p *Proxy) createClaimed(ctx context.Context, m *corralv1.CreateRequest, want Want) (*connect.Response[corralv1.CreateResponse], error) {
	c := p.cfg.Claims
	rid := m.Placement.RequestId
	// Assume no claim: the first claim attempt returns the one there is.
	var cl *claim
	var rev int64
	refused := map[string]string{}
	var target *NodeView
	var pl *Placement
	mine := false // this call owns the claim, at revision rev
	for rounds := 0; ; {
		if !mine {
			if rounds++; rounds > 4*p.cfg.MaxAttempts {
				return nil, errdefs.Unavailable("request %s: its claim keeps changing hands", rid)
			}
			switch owner, err := c.alive(ctx, ownerOf(cl)); {
			case err != nil:
				return nil, errdefs.Unavailable("%v", err)
			case cl == nil: // nobody has it: claim it for a placed node
				if pl, err = p.place(want, refused); err != nil {
					return nil, err
				}
				ok, found, frev, err := c.put(ctx, rid, 0, claim{Owner: c.ID, Node: pl.Node.ID, State: claimPlacing})
				if !ok {
					pl.Done(false)
					if err != nil {
						return nil, errdefs.Unavailable("%v", err)
					}
					cl, rev = found, frev
					continue
				}
				mine, rev, target = true, frev, pl.Node
			case cl.State == claimMade:
				// Made already: its node answers with that sandbox.
				v := p.cfg.Watcher.Snapshot().Node(cl.Node)
				if v == nil {
					return nil, errdefs.FailedPrecondition("request %s made sandbox %s on node %s, which has left the cluster", rid, cl.Sandbox, cl.Node)
				}
				if v.State == NodeLost {
					return nil, errdefs.Unavailable("request %s made sandbox %s on %s", rid, cl.Sandbox, v.Reason)
				}
				resp, err := p.client(v).Create(ctx, connect.NewRequest(m))
				if err != nil {
					return nil, unreachable(v, err)
				}
				return connect.NewResponse(resp.Msg), nil
			case owner: // another call places it now: wait for it
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(claimPoll):
				}
				rounds-- // waiting for a live owner is bounded by ctx alone
				if cl, rev, err = c.get(ctx, rid); err != nil {
					return nil, errdefs.Unavailable("%v", err)
				}
				continue
			default: // its owner is gone: take it over, on the node it chose
				ok, found, frev, err := c.put(ctx, rid, rev, claim{Owner: c.ID, Node: cl.Node, State: claimPlacing})
				if err != nil {
					return nil, errdefs.Unavailable("%v", err)
				}
				if !ok {
					cl, rev = found, frev
					continue
				}
				mine, rev, pl = true, frev, nil
				if target = p.cfg.Watcher.Snapshot().Node(cl.Node); target == nil {
					refused[cl.Node] = "left the cluster"
				} else if target.State == NodeLost {
					// It may have made the sandbox: not elsewhere.
					c.put(ctx, rid, rev, claim{Node: cl.Node, State: claimPlacing})
					return nil, errdefs.Unavailable("request %s may have been created on %s", rid, target.Reason)
				}
			}
		}
		var err error
		if target != nil {
			var resp *connect.Response[corralv1.CreateResponse]
			resp, err = p.client(target).Create(ctx, connect.NewRequest(m))
			if pl != nil {
				pl.Done(err == nil)
			}
			if err == nil {
				c.put(ctx, rid, rev, claim{Node: target.ID, State: claimMade, Sandbox: resp.Msg.GetSandbox().GetId()})
				return connect.NewResponse(resp.Msg), nil
			}
			if !surelyNothing(err) {
				// Broken half way: the node may have made it. A repeat
				// goes there (no owner now), and the node dedupes.
				c.put(ctx, rid, rev, claim{Node: target.ID, State: claimPlacing})
				return nil, unreachable(target, err)
			}
			refused[target.ID] = connectMessage(err)
		}
		// Refused: offer it to another node and move the claim there.
		if len(refused) >= p.cfg.MaxAttempts {
			c.drop(ctx, rid, rev)
			return nil, noNode(refused)
		}
		if pl, err = p.place(want, refused); err != nil {
			c.drop(ctx, rid, rev)
			return nil, err
		}
		ok, found, frev, err := c.put(ctx, rid, rev, claim{Owner: c.ID, Node: pl.Node.ID, State: claimPlacing})
		if !ok {
			pl.Done(false)
			if err != nil {
				return nil, errdefs.Unavailable("%v", err)
			}
			mine, cl, rev = false, found, frev
			continue
		}
		rev, target = frev, pl.Node
	}
}

func ownerOf(cl *claim) string {
	if cl == nil {
		return ""
	}
	return cl.Owner
}
