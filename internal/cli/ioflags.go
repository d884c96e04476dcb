package cli

import (
	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/client"
)

// ioFlags are create's and run's disk I/O limits.
type ioFlags struct {
	readBPS, writeBPS   string
	readIOPS, writeIOPS int64
}

func (f *ioFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.readBPS, "io-read-bps", "", "disk read limit in bytes per second (64Mi); default and most: the node's")
	fl.StringVar(&f.writeBPS, "io-write-bps", "", "disk write limit in bytes per second (32Mi); default and most: the node's")
	fl.Int64Var(&f.readIOPS, "io-read-iops", 0, "disk read operations per second; default and most: the node's")
	fl.Int64Var(&f.writeIOPS, "io-write-iops", 0, "disk write operations per second; default and most: the node's")
}

func (f *ioFlags) limits() (client.IOLimits, error) {
	l := client.IOLimits{ReadOpsPerSec: f.readIOPS, WriteOpsPerSec: f.writeIOPS}
	var err error
	if l.ReadBytesPerSec, err = parseBytes("io-read-bps", f.readBPS); err != nil {
		return l, err
	}
	if l.WriteBytesPerSec, err = parseBytes("io-write-bps", f.writeBPS); err != nil {
		return l, err
	}
	return l, nil
}
