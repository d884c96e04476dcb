package redteam

import (
	"fmt"
	"path/filepath"
	"slices"
)

// LoadTables reads the main table and every extra table matching glob
// (rows added by one round of the red team live in a file of their own,
// testdata/expected-*.json), merged in that order. The extra tables must
// name the same backends, and no attempt may appear twice.
func LoadTables(main, glob string) (*Table, error) {
	t, err := LoadTable(main)
	if err != nil {
		return nil, err
	}
	extra, err := filepath.Glob(glob)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", glob, err)
	}
	for _, p := range extra {
		x, err := LoadTable(p)
		if err != nil {
			return nil, err
		}
		if !slices.Equal(x.Backends, t.Backends) {
			return nil, fmt.Errorf("%s: backends %v, want %v as in %s", p, x.Backends, t.Backends, main)
		}
		for _, a := range x.Attempts {
			if _, dup := t.Lookup(a.Name); dup {
				return nil, fmt.Errorf("%s: attempt %q is already in another table", p, a.Name)
			}
			t.Attempts = append(t.Attempts, a)
		}
	}
	return t, nil
}
