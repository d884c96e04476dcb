package cluster

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/iam"
)

// summaryPrefix holds each node's sandbox summary, with no lease, so that
// a lost node's sandboxes can still be listed (as lost). It is outside
// clusterPrefix: control instances read a summary only when its node is
// lost, they do not follow every rewrite.
const summaryPrefix = "/corral/sandboxes/"

// maxSummaryBytes keeps a summary well under etcd's request limit (1.5 MiB
// by default).
const maxSummaryBytes = 1 << 20

// summaryEntry is one sandbox in a node's summary: what List shows of it
// once the node is lost.
type summaryEntry struct {
	ID      string            `json:"id"`
	Project string            `json:"p,omitempty"`
	Backend string            `json:"b,omitempty"`
	Image   string            `json:"i,omitempty"`
	Labels  map[string]string `json:"l,omitempty"`
	Created int64             `json:"c,omitempty"` // unix nanoseconds
}

// nodeSummary is a node's sandboxes as of AsOf, sorted by id.
type nodeSummary struct {
	Node      string         `json:"node"`
	AsOf      time.Time      `json:"as_of"`
	Sandboxes []summaryEntry `json:"sandboxes"`
}

// fingerprint changes whenever the set of sandboxes does (ids are never
// reused; a sandbox's project, labels and image never change).
func fingerprint(sbs []*corralv1.Sandbox) uint64 {
	var fp uint64
	for _, sb := range sbs {
		h := fnv.New64a()
		_, _ = io.WriteString(h, sb.Id)
		fp ^= h.Sum64()
	}
	return fp ^ uint64(len(sbs))
}

// encodeSummary is the gzipped JSON of node's summary; labels are left out
// if the whole would not fit in maxSummaryBytes.
func encodeSummary(node string, asOf time.Time, sbs []*corralv1.Sandbox) ([]byte, error) {
	s := nodeSummary{Node: node, AsOf: asOf.UTC(), Sandboxes: make([]summaryEntry, 0, len(sbs))}
	for _, sb := range sbs {
		s.Sandboxes = append(s.Sandboxes, summaryEntry{ID: sb.Id, Project: sb.Project, Backend: sb.Backend, Image: sb.Image,
			Labels: sb.Labels, Created: sb.GetCreatedAt().AsTime().UnixNano()})
	}
	sort.Slice(s.Sandboxes, func(i, j int) bool { return s.Sandboxes[i].ID < s.Sandboxes[j].ID })
	for _, withLabels := range []bool{true, false} {
		if !withLabels {
			for i := range s.Sandboxes {
				s.Sandboxes[i].Labels = nil
			}
		}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed) // the level is valid; ids compress well at any level
		if err := json.NewEncoder(zw).Encode(s); err != nil {
			return nil, err
		}
		if err := zw.Close(); err != nil {
			return nil, err
		}
		if buf.Len() <= maxSummaryBytes {
			return buf.Bytes(), nil
		}
	}
	return nil, fmt.Errorf("node %s: summary of %d sandboxes is over %d bytes even without labels", node, len(sbs), maxSummaryBytes)
}

// readSummary is node's last summary (nil when it never wrote one).
func readSummary(ctx context.Context, cli *clientv3.Client, node string) (*nodeSummary, error) {
	resp, err := cli.Get(ctx, summaryPrefix+node)
	if err != nil {
		return nil, fmt.Errorf("read the sandbox summary of node %s: %w", node, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(resp.Kvs[0].Value))
	if err != nil {
		return nil, fmt.Errorf("sandbox summary of node %s: %w", node, err)
	}
	s := new(nodeSummary)
	if err := json.NewDecoder(zr).Decode(s); err != nil {
		return nil, fmt.Errorf("sandbox summary of node %s: %w", node, err)
	}
	return s, nil
}

// find is the entry of sandbox id, or nil.
func (s *nodeSummary) find(id string) *summaryEntry {
	i := sort.Search(len(s.Sandboxes), func(i int) bool { return s.Sandboxes[i].ID >= id })
	if i < len(s.Sandboxes) && s.Sandboxes[i].ID == id {
		return &s.Sandboxes[i]
	}
	return nil
}

// lost is e as a sandbox of the lost node v.
func (e *summaryEntry) lost(v *NodeView, asOf time.Time) *corralv1.Sandbox {
	sb := lostSandbox(e.ID, v)
	sb.Project, sb.Backend, sb.Image, sb.Labels = e.Project, e.Backend, e.Image, e.Labels
	if e.Created != 0 {
		sb.CreatedAt = timestamppb.New(time.Unix(0, e.Created))
	}
	sb.StopReason += fmt.Sprintf(" (as the node last listed it, at %s)", asOf.Format(time.RFC3339))
	return sb
}

// lostTokenMark starts the per-node part of a List page token that points
// into a lost node's summary (a node's own tokens never start with it).
const lostTokenMark = "\x01"

// lostCursor is the last id listed of a lost node ("" from its start: a
// token of the node's own, from before it was lost, cannot be followed in
// the summary's order).
func lostCursor(tok string) string {
	after, ok := strings.CutPrefix(tok, lostTokenMark)
	if !ok {
		return ""
	}
	return after
}

// listLost appends the lost node v's sandboxes after id after, matching
// labels and visible to the caller, until out has size; it returns the
// last id listed when more remain. A node without a summary (or one that
// cannot be read now) lists nothing; it is named unavailable regardless.
func (p *Proxy) listLost(ctx context.Context, v *NodeView, labels map[string]string, after string, size int, out *corralv1.ListResponse) string {
	s, err := readSummary(ctx, p.cfg.Watcher.cli, v.ID)
	if err != nil {
		p.cfg.Logger.Warn("list a lost node's sandboxes", "node", v.ID, "err", err)
		return ""
	}
	if s == nil {
		return ""
	}
	caller, scoped := iam.FromContext(ctx)
	for i := range s.Sandboxes {
		e := &s.Sandboxes[i]
		if e.ID <= after || (scoped && !caller.Sees(e.Project)) || !labelsMatch(e.Labels, labels) {
			continue
		}
		if len(out.Sandboxes) == size {
			return out.Sandboxes[len(out.Sandboxes)-1].Id
		}
		out.Sandboxes = append(out.Sandboxes, e.lost(v, s.AsOf))
	}
	return ""
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// lostSandbox describes sandbox id of the lost node v: from the node's
// summary when it lists it, from the id alone otherwise.
func (p *Proxy) lostSandbox(ctx context.Context, id string, v *NodeView) *corralv1.Sandbox {
	s, err := readSummary(ctx, p.cfg.Watcher.cli, v.ID)
	if err != nil {
		p.cfg.Logger.Warn("describe a lost node's sandbox", "node", v.ID, "err", err)
	}
	if s != nil {
		if e := s.find(id); e != nil {
			return e.lost(v, s.AsOf)
		}
	}
	return lostSandbox(id, v)
}
