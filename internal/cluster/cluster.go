// Package cluster makes corral a cluster on etcd: nodes register under a
// lease and publish their load (Registrar, NodeAgent), control instances
// watch them (Watcher), place creates by power-of-k choices with their own
// in-flight placements overlaid (Placer) and route every per-sandbox call
// to the node named in the sandbox id (Proxy, and Rollouts for the
// RolloutService, whose calls by label go to every node). Control instances keep no
// per-sandbox state. Calls from control to node carry the caller's
// iam.Principal, authenticated with the cluster secret.
//
// It imports the API types, errdefs, iam, liveview (the live-view relay)
// and the etcd client; it must not
// import the node, backend, server or CLI packages (a node's sandboxes are
// reached through the SandboxService handler it is given).
package cluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/corral-dev/corral/internal/iam"
)

// Key layout in etcd (all under clusterPrefix, which the watcher watches).
const (
	clusterPrefix = "/corral/cluster/"
	// nodesPrefix holds one record per live node, under its lease.
	nodesPrefix = "/corral/cluster/nodes/"
	// membersPrefix holds one record per node that ever registered, with
	// no lease: a member without a live node record is lost.
	membersPrefix = "/corral/cluster/members/"
	// drainPrefix marks drained nodes.
	drainPrefix = "/corral/cluster/drain/"
	// movesPrefix routes a migrated sandbox: its id -> the node it is on
	// now (its id names the node it was made on).
	movesPrefix = "/corral/cluster/moves/"
)

// Label keys with a meaning to placement.
const (
	// PoolLabel = BurstPool marks a burst-pool node.
	PoolLabel = "pool"
	BurstPool = "burst"
	// RequestIDLabel carries a create's client request id on the sandbox,
	// so a node rebuilds its dedupe index after a restart.
	RequestIDLabel = "corral.request-id"
)

// Capacity is what a node admits at most.
type Capacity struct {
	Sandboxes   int64 `json:"sandboxes"`
	CPUMillis   int64 `json:"cpu_millis"`
	MemoryBytes int64 `json:"memory_bytes"`
}

// Load is what a node has committed (live sandboxes and creates it admitted
// but has not finished).
type Load struct {
	Sandboxes   int64            `json:"sandboxes"`
	CPUMillis   int64            `json:"cpu_millis"`
	MemoryBytes int64            `json:"memory_bytes"`
	Backends    map[string]int64 `json:"backends,omitempty"`
	// Labels counts live sandboxes per "key=value" label (the most
	// common maxLabelCounts), for anti-affinity.
	Labels map[string]int64 `json:"labels,omitempty"`
	// Projects is what each project's live sandboxes on the node use
	// (the project itself, not its subprojects), for cluster-wide quotas.
	Projects map[string]iam.Usage `json:"projects,omitempty"`
	// MemoryUsed and LoadAverage are the host's, as measured.
	MemoryUsed  int64   `json:"memory_used,omitempty"`
	LoadAverage float64 `json:"load_average,omitempty"`
}

// maxLabelCounts bounds Load.Labels, which lives in the node's record.
const maxLabelCounts = 512

// Utilisation is the largest committed fraction of c.
func (l Load) Utilisation(c Capacity) float64 {
	u := 0.0
	frac := func(used, total int64) {
		if total > 0 {
			u = max(u, float64(used)/float64(total))
		}
	}
	frac(l.Sandboxes, c.Sandboxes)
	frac(l.CPUMillis, c.CPUMillis)
	frac(l.MemoryBytes, c.MemoryBytes)
	return u
}

// NodeRecord is a live node's registration.
type NodeRecord struct {
	ID       string            `json:"id"`
	Address  string            `json:"address"`
	Version  string            `json:"version"`
	Labels   map[string]string `json:"labels,omitempty"`
	Backends []string          `json:"backends"`
	Capacity Capacity          `json:"capacity"`
	Load     Load              `json:"load"`
	// AsOf is when Load was measured; it covers every create the node
	// answered before then.
	AsOf time.Time `json:"as_of"`
}

// MemberRecord is kept for every node that registered, also after its
// lease expired, so that its sandboxes can be reported lost.
type MemberRecord struct {
	ID           string    `json:"id"`
	Address      string    `json:"address"`
	RegisteredAt time.Time `json:"registered_at"`
}

func marshal(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("cluster: marshal %T: %v", v, err)) // plain structs always marshal
	}
	return string(b)
}

func idFromKey(prefix, key string) string { return strings.TrimPrefix(key, prefix) }

// Dial connects to etcd. The client's own zap logging is off: its retries
// are routine here, and failures reach the caller as errors.
func Dial(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(endpoints, ","), err)
	}
	return cli, nil
}
