package blob

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/corral-dev/corral/internal/errdefs"
)

// S3Config names an S3-compatible bucket (AWS S3, SeaweedFS, MinIO, …).
type S3Config struct {
	Endpoint  string `json:"endpoint"` // host:port
	Bucket    string `json:"bucket"`
	Prefix    string `json:"prefix,omitempty"`     // object name prefix, e.g. "corral/"
	AccessKey string `json:"access_key,omitempty"` // empty with SecretKey: anonymous requests
	SecretKey string `json:"secret_key,omitempty"`
	Region    string `json:"region,omitempty"`
	Secure    bool   `json:"secure,omitempty"` // HTTPS
	// Transport replaces the HTTP transport (nil: minio-go's default).
	Transport http.RoundTripper `json:"-"`
}

// S3 is a Store in an S3-compatible bucket, the store many nodes share.
type S3 struct {
	client *minio.Client
	core   minio.Core
	cfg    S3Config
}

// NewS3 returns the store; it does not contact the server (EnsureBucket does).
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" {
		return nil, errdefs.InvalidArgument("endpoint: empty (want host:port of the S3 server)")
	}
	if cfg.Bucket == "" {
		return nil, errdefs.InvalidArgument("bucket: empty")
	}
	creds := credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        creds,
		Secure:       cfg.Secure,
		Region:       cfg.Region,
		Transport:    cfg.Transport,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 %s: %w", cfg.Endpoint, err)
	}
	return &S3{client: c, core: minio.Core{Client: c}, cfg: cfg}, nil
}

// EnsureBucket creates the bucket unless it exists.
func (s *S3) EnsureBucket(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.cfg.Bucket)
	if err != nil {
		return errdefs.Unavailable("s3 bucket %s: %v", s.cfg.Bucket, err)
	}
	if ok {
		return nil
	}
	if err := s.client.MakeBucket(ctx, s.cfg.Bucket, minio.MakeBucketOptions{Region: s.cfg.Region}); err != nil {
		return fmt.Errorf("s3 make bucket %s: %w", s.cfg.Bucket, err)
	}
	return nil
}

func (s *S3) object(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return s.cfg.Prefix + "blobs/" + strings.Replace(key, ":", "/", 1), nil
}

// s3Error classes a minio error.
func s3Error(key string, err error) error {
	switch minio.ToErrorResponse(err).Code {
	case "NoSuchKey", "NotFound", "NoSuchBucket":
		return errdefs.NotFound("s3 blob %s: %v", key, err)
	case "InvalidRange":
		return errdefs.InvalidArgument("s3 blob %s: %v", key, err)
	}
	return errdefs.Unavailable("s3 blob %s: %v", key, err)
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (int64, error) {
	obj, err := s.object(key)
	if err != nil {
		return 0, err
	}
	info, err := s.client.StatObject(ctx, s.cfg.Bucket, obj, minio.StatObjectOptions{})
	if err != nil {
		return 0, s3Error(key, err)
	}
	return info.Size, nil
}

// GetRange implements Store.
func (s *S3) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	obj, err := s.object(key)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 {
		return nil, errdefs.InvalidArgument("range: %d bytes at %d", n, off)
	}
	if n == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, errdefs.InvalidArgument("range: %v", err)
	}
	rc, info, _, err := s.core.GetObject(ctx, s.cfg.Bucket, obj, opts)
	if err != nil {
		return nil, s3Error(key, err)
	}
	if info.Size != n {
		rc.Close()
		return nil, errdefs.InvalidArgument("range: %d bytes at %d: s3 returned %d bytes (blob %s shorter?)", n, off, info.Size, key)
	}
	return &exactReader{rc: rc, left: n, what: "s3 blob " + key}, nil
}

// Put implements Store. The content goes to a temporary object, checked
// while it streams, and is copied under its key only when it matched: the
// uploader may have sent every byte before the check can fail it, and a
// removal afterwards would leave a window (or, on an eventually consistent
// store, longer) in which the key names wrong content. A crash can leave
// objects under <prefix>tmp/ behind (a bucket lifecycle rule removes them).
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	obj, err := s.object(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return errdefs.InvalidArgument("size: %d is negative", size)
	}
	if _, err := s.Stat(ctx, key); err == nil {
		return nil
	}
	tmp := s.cfg.Prefix + "tmp/" + strings.Replace(key, ":", "-", 1) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer func() {
		// Best effort: the copy or the failure is what matters.
		_ = s.client.RemoveObject(context.WithoutCancel(ctx), s.cfg.Bucket, tmp, minio.RemoveObjectOptions{})
	}()
	v := newVerifier(r, key, size)
	_, err = s.client.PutObject(ctx, s.cfg.Bucket, tmp, v, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		PartSize:    64 << 20,
	})
	if verr := v.result(); verr != nil {
		return fmt.Errorf("put blob %s: %w", key, verr)
	}
	if err != nil {
		return s3Error(key, err)
	}
	// ComposeObject copies server-side, in parts past 5 GiB.
	_, err = s.client.ComposeObject(ctx,
		minio.CopyDestOptions{Bucket: s.cfg.Bucket, Object: obj},
		minio.CopySrcOptions{Bucket: s.cfg.Bucket, Object: tmp})
	if err != nil {
		return s3Error(key, err)
	}
	return nil
}
