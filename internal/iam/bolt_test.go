package iam_test

import (
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/iam/storetest"
)

func TestBoltStoreContract(t *testing.T) {
	dirs := map[*testing.T]string{}
	storetest.Run(t, func(t *testing.T) iam.Store {
		dir, ok := dirs[t]
		if !ok {
			dir = t.TempDir()
			dirs[t] = dir
		}
		s, err := iam.OpenBolt(filepath.Join(dir, "iam.db"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
