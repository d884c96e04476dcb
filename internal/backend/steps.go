package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Undo is a stack of undo functions: Run calls them in reverse order, once.
type Undo []func()

// Push adds f, to run before every undo pushed earlier.
func (u *Undo) Push(f func()) { *u = append(*u, f) }

// Run undoes everything pushed so far, latest first, and empties the stack.
func (u *Undo) Run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}

// Step is one named step of a backend's Create. It does its part on the
// creation state C and pushes its own undo before it returns.
type Step[C any] struct {
	Name string
	Run  func(c C, ctx context.Context) error
}

// ErrInjected is the failure RunSteps injects at the step a test names.
var ErrInjected = errors.New("injected failure")

// RunSteps runs steps in order on c. At the first failure — a step's
// error, a cancelled ctx, or the step named failAt (a test hook; "" for
// none) — it runs undo and returns the error wrapped with the step's name,
// leaving nothing of the create behind. On success it returns, for a
// debug log, each step's name and how long it took.
func RunSteps[C any](ctx context.Context, c C, steps []Step[C], undo *Undo, failAt string) ([]any, error) {
	timings := make([]any, 0, 2*len(steps))
	for _, st := range steps {
		start := time.Now()
		err := ctx.Err()
		if err == nil && failAt == st.Name {
			err = ErrInjected
		}
		if err == nil {
			err = st.Run(c, ctx)
		}
		if err != nil {
			undo.Run()
			return nil, fmt.Errorf("%s: %w", st.Name, err)
		}
		timings = append(timings, st.Name, time.Since(start))
	}
	return timings, nil
}
