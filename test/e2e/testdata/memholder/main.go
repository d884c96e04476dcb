// Command memholder holds MiB of pseudo-random memory (its first argument)
// for the reclaim tests: it writes the memory's sha256 to /tmp/hash0, counts
// in /tmp/counter every 20 ms, and when /tmp/check appears it rehashes the
// memory and writes "<counter> <sha256>" to /tmp/check.out.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"
)

func put(path, s string) {
	_ = os.WriteFile(path+".tmp", []byte(s), 0o644)
	_ = os.Rename(path+".tmp", path)
}

func main() {
	mib, _ := strconv.Atoi(os.Args[1])
	data := make([]byte, mib<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(data); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	hash := func() string { s := sha256.Sum256(data); return hex.EncodeToString(s[:]) }
	put("/tmp/hash0", hash())
	for n := 1; ; n++ {
		put("/tmp/counter", strconv.Itoa(n))
		if _, err := os.Stat("/tmp/check"); err == nil {
			_ = os.Remove("/tmp/check")
			put("/tmp/check.out", fmt.Sprintf("%d %s", n, hash()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
