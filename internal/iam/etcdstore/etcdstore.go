// Package etcdstore is the iam.Store of a cluster: IAM records as etcd
// keys under one prefix, a record's revision being its etcd mod revision,
// so a quota change checked along a project's ancestors is one etcd
// transaction seen alike by every control instance. It imports iam,
// errdefs and the etcd client; it must not import the API, control, node
// or server packages.
package etcdstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// DefaultPrefix is where corral keeps IAM records in etcd.
const DefaultPrefix = "/corral/iam/"

// Store is an iam.Store on etcd.
type Store struct {
	cli    *clientv3.Client
	prefix string
	// own is set when Close should close cli.
	own bool
}

var _ iam.Store = (*Store)(nil)

// New keeps records under prefix (DefaultPrefix when empty) through cli,
// which the caller keeps and closes.
func New(cli *clientv3.Client, prefix string) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{cli: cli, prefix: prefix}
}

// Open connects to the etcd endpoints; Close closes the connection.
func Open(ctx context.Context, endpoints []string, prefix string) (*Store, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Context: ctx, Logger: zap.NewNop()})
	if err != nil {
		return nil, errdefs.Unavailable("iam store: etcd %s: %v", strings.Join(endpoints, ","), err)
	}
	s := New(cli, prefix)
	s.own = true
	return s, nil
}

func checkKey(key string) error {
	if key == "" {
		return errdefs.InvalidArgument("iam store: key: required")
	}
	return nil
}

// Get returns key's value and revision.
func (s *Store) Get(ctx context.Context, key string) ([]byte, int64, error) {
	if err := checkKey(key); err != nil {
		return nil, 0, err
	}
	var resp *clientv3.GetResponse
	err := retry(ctx, func() (err error) { resp, err = s.cli.Get(ctx, s.prefix+key); return err })
	if err != nil {
		return nil, 0, errdefs.Unavailable("iam store: get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, errdefs.NotFound("iam store: %s: no such record", key)
	}
	kv := resp.Kvs[0]
	return kv.Value, kv.ModRevision, nil
}

// List returns the records under prefix, in key order.
func (s *Store) List(ctx context.Context, prefix string) ([]iam.Entry, error) {
	var resp *clientv3.GetResponse
	err := retry(ctx, func() (err error) {
		resp, err = s.cli.Get(ctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		return err
	})
	if err != nil {
		return nil, errdefs.Unavailable("iam store: list %s: %v", prefix, err)
	}
	out := make([]iam.Entry, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, iam.Entry{Key: strings.TrimPrefix(string(kv.Key), s.prefix), Value: kv.Value, Rev: kv.ModRevision})
	}
	return out, nil
}

// Txn applies writes if every condition holds, as one etcd transaction.
func (s *Store) Txn(ctx context.Context, conds []iam.Cond, writes []iam.Write) error {
	cmps := make([]clientv3.Cmp, 0, len(conds))
	for _, c := range conds {
		if err := checkKey(c.Key); err != nil {
			return err
		}
		if c.Rev < 0 {
			return errdefs.InvalidArgument("iam store: condition on %s: rev %d is negative", c.Key, c.Rev)
		}
		if c.Rev == 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.prefix+c.Key), "=", 0))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.prefix+c.Key), "=", c.Rev))
		}
	}
	ops := make([]clientv3.Op, 0, len(writes))
	seen := map[string]bool{}
	for _, w := range writes {
		if err := checkKey(w.Key); err != nil {
			return err
		}
		// etcd refuses a transaction writing one key twice; say so in the
		// store's own words.
		if seen[w.Key] {
			return errdefs.InvalidArgument("iam store: write to %s: key written twice in one transaction", w.Key)
		}
		seen[w.Key] = true
		if w.Delete {
			ops = append(ops, clientv3.OpDelete(s.prefix+w.Key))
		} else {
			ops = append(ops, clientv3.OpPut(s.prefix+w.Key, string(w.Value)))
		}
	}
	var resp *clientv3.TxnResponse
	attempts := 0
	err := retry(ctx, func() (err error) {
		attempts++
		resp, err = s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return errdefs.Unavailable("iam store: txn: %v", err)
	}
	// An attempt that timed out may have committed: then the one sent
	// again fails its conditions on our own writes.
	if !resp.Succeeded && attempts > 1 && s.written(ctx, writes) {
		return nil
	}
	if !resp.Succeeded {
		return fmt.Errorf("iam store: a record changed since it was read: %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// written reports whether every write is already in the store as asked.
func (s *Store) written(ctx context.Context, writes []iam.Write) bool {
	for _, w := range writes {
		resp, err := s.cli.Get(ctx, s.prefix+w.Key)
		if err != nil {
			return false
		}
		if w.Delete != (len(resp.Kvs) == 0) || !w.Delete && string(resp.Kvs[0].Value) != string(w.Value) {
			return false
		}
	}
	return true
}

// retryFor bounds how long a request is sent again while etcd recovers
// (an election takes a few seconds after a member is lost).
const retryFor = 15 * time.Second

// retry runs op again while it fails with an error etcd answers when it
// has no leader or lost one mid-request, for up to retryFor or until ctx
// ends.
func retry(ctx context.Context, op func() error) error {
	deadline := time.Now().Add(retryFor)
	wait := 50 * time.Millisecond
	for {
		err := op()
		if err == nil || !transient(err) || time.Now().Add(wait).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

func transient(err error) bool {
	switch rpctypes.Error(err) {
	case rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrTimeout,
		rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost:
		return true
	}
	return status.Code(err) == codes.Unavailable
}

// Close closes the etcd connection if Open made it.
func (s *Store) Close() error {
	if s.own {
		return s.cli.Close()
	}
	return nil
}
