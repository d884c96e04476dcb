package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	qmpc "github.com/corral-dev/corral/internal/qmp"
)

// qmp is the shared QMP client (internal/qmp) under the names this
// package's drivers use.
type qmp struct{ *qmpc.Client }

func dialQMP(ctx context.Context, path string) (*qmp, error) {
	c, err := qmpc.Dial(ctx, path)
	if err != nil {
		return nil, err
	}
	return &qmp{c}, nil
}

func (q *qmp) run(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return q.Run(ctx, cmd, args)
}

func (q *qmp) close() error                               { return q.Close() }
func (q *qmp) status(ctx context.Context) (string, error) { return q.Status(ctx) }

// waitMigration polls query-migrate until the migration completed.
func (q *qmp) waitMigration(ctx context.Context) error {
	for {
		raw, err := q.run(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var m struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("qmp query-migrate: %w", err)
		}
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return errors.New("migration " + m.Status + ": " + m.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
