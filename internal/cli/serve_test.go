package cli

import (
	"strings"
	"testing"
	"time"
)

func TestBlobFlags(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "id")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	ok := blobFlags{store: "s3://bucket/corral?endpoint=s3.local:9000&secure=true&region=eu", chunk: "1Mi", cache: "2Gi", timeout: 5 * time.Second}
	bc, err := ok.config()
	if err != nil {
		t.Fatal(err)
	}
	s3 := bc.Store.S3
	if bc.Store.Kind != "s3" || s3.Bucket != "bucket" || s3.Prefix != "corral/" || s3.Endpoint != "s3.local:9000" ||
		!s3.Secure || s3.Region != "eu" || s3.AccessKey != "id" || s3.SecretKey != "secret" ||
		bc.ChunkSize != 1<<20 || bc.CacheBytes != 2<<30 || bc.FetchTimeout != 5*time.Second {
		t.Errorf("config: %+v", bc)
	}
	if bc, err := (blobFlags{store: "none"}).config(); bc != nil || err != nil {
		t.Errorf("none: %+v %v", bc, err)
	}
	for _, c := range []struct {
		f    blobFlags
		want string
	}{
		{blobFlags{store: "s3://bucket", timeout: time.Second}, "--blob-store"},
		{blobFlags{store: "s3://bucket?endpoint=h:1&secure=maybe", timeout: time.Second}, "secure"},
		{blobFlags{store: "ftp://x", timeout: time.Second}, "--blob-store"},
		{blobFlags{store: "dir:relative", timeout: time.Second}, "dir:/ABSOLUTE/PATH"},
		{blobFlags{store: "http://peer:1", chunk: "lots", timeout: time.Second}, "blob-chunk-size"},
		{blobFlags{store: "http://peer:1", timeout: 0}, "--blob-fetch-timeout"},
		{blobFlags{store: "none", listen: "127.0.0.1:0"}, "--blob-listen needs --blob-store"},
	} {
		if _, err := c.f.config(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.f, err, c.want)
		}
	}
}
