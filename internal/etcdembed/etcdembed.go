// Package etcdembed runs a real etcd member (go.etcd.io/etcd/server/v3's
// embed package) inside a corral process: `corral etcd` for
// scripts/cluster.sh, and one- or three-member clusters for tests and
// `corral bench cluster`. It owns no corral data; it must not import any
// other corral package.
package etcdembed

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config describes one member.
type Config struct {
	// Name is the member's name in InitialCluster.
	Name string
	// DataDir holds the member's WAL and database.
	DataDir string
	// ClientURL and PeerURL are http://HOST:PORT addresses to listen on
	// and advertise.
	ClientURL, PeerURL string
	// InitialCluster is "name=peerURL,..." of every founding member
	// (default: this member alone).
	InitialCluster string
	// NoFsync trades durability for speed (tests and benchmarks on a
	// shared machine only).
	NoFsync bool
}

// Member is a running etcd member.
type Member struct {
	etcd *embed.Etcd
	cfg  Config
}

// Start starts the member and waits until it serves (with a cluster, until
// a quorum of members is up).
func Start(ctx context.Context, c Config) (*Member, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.DataDir
	// etcd logs through zap; corral's logs say what matters (it also
	// logs errors when closed, which are noise here).
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = c.NoFsync
	// Nodes rewrite their load records every report interval and their
	// sandbox summaries on change: keep 5 minutes of history, not all of it.
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "periodic", "5m"
	cu, err := url.Parse(c.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd client url %q: %w", c.ClientURL, err)
	}
	pu, err := url.Parse(c.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd peer url %q: %w", c.PeerURL, err)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = c.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = c.Name + "=" + c.PeerURL
	}
	cfg.InitialClusterToken = "corral"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd member %s: %w", c.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd member %s: %w", c.Name, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("etcd member %s not ready: %w", c.Name, ctx.Err())
	}
	return &Member{etcd: e, cfg: c}, nil
}

// ClientURL is the member's client address.
func (m *Member) ClientURL() string { return m.cfg.ClientURL }

// Err reports the member failing after start.
func (m *Member) Err() <-chan error { return m.etcd.Err() }

// Close stops the member.
func (m *Member) Close() { m.etcd.Close() }

// Cluster is several members started together.
type Cluster struct {
	Members []*Member
}

// StartCluster starts n members on 127.0.0.1 ports from basePort (client
// basePort+2i, peer basePort+2i+1) with data dirs under dir.
func StartCluster(ctx context.Context, dir string, n, basePort int, noFsync bool) (*Cluster, error) {
	var initial []string
	cfgs := make([]Config, n)
	for i := range n {
		cfgs[i] = Config{
			Name:      fmt.Sprintf("m%d", i),
			DataDir:   fmt.Sprintf("%s/m%d", dir, i),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", basePort+2*i),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", basePort+2*i+1),
			NoFsync:   noFsync,
		}
		initial = append(initial, cfgs[i].Name+"="+cfgs[i].PeerURL)
	}
	c := &Cluster{}
	errs := make(chan error, n)
	members := make([]*Member, n)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i := range n {
		cfgs[i].InitialCluster = strings.Join(initial, ",")
		go func() {
			m, err := Start(ctx, cfgs[i])
			members[i] = m
			errs <- err
		}()
	}
	var firstErr error
	for range n {
		if err := <-errs; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, m := range members {
		if m != nil {
			c.Members = append(c.Members, m)
		}
	}
	if firstErr != nil {
		c.Close()
		return nil, firstErr
	}
	return c, nil
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL())
	}
	return out
}

// Close stops every member.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.Close()
	}
}
