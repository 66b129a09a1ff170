package registry

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go/aws"
	"github.com/aws/aws-sdk-go/aws/session"
	"github.com/aws/aws-sdk-go/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

func TestParseS3URL(t *testing.T) {
	t.Parallel()
	good := []struct {
		in   string
		want S3
	}{
		{"s3://robots?region=eu-west-1", S3{Bucket: "robots", Region: "eu-west-1"}},
		{"s3://robots/edgebox/images/?region=eu-west-1", S3{Bucket: "robots", Prefix: "edgebox/images", Region: "eu-west-1"}},
		{"s3://robots?endpoint=https://s3.bank.example:9000", S3{Bucket: "robots", Region: "us-east-1", Endpoint: "https://s3.bank.example:9000", PathStyle: true}},
		{"s3://robots.v2?endpoint=http://10.0.0.5:8333&region=site-1&path-style=false", S3{Bucket: "robots.v2", Region: "site-1", Endpoint: "http://10.0.0.5:8333"}},
	}
	for _, g := range good {
		got, err := ParseS3URL(g.in)
		if err != nil || *got != g.want {
			t.Errorf("ParseS3URL(%q) = %+v, %v; want %+v", g.in, got, err, g.want)
		}
	}
	bad := []struct{ in, says string }{
		{"robots", "want s3://"},
		{"https://robots", "want s3://"},
		{"s3://", "want s3://"},
		{"s3://key:secret@robots?region=x", "want s3://"},
		{"s3://robots", "region"},
		{"s3://Robots?region=x", "bucket"},
		{"s3://ro?region=x", "bucket"},
		{"s3://-robots?region=x", "bucket"},
		{"s3://robots/../etc?region=x", "prefix"},
		{"s3://robots/a b?region=x", "prefix"},
		{"s3://robots?region=x&acl=public", "unknown setting"},
		{"s3://robots?endpoint=ftp://h", "endpoint"},
		{"s3://robots?endpoint=http://h/path", "endpoint"},
		{"s3://robots?endpoint=http://h&path-style=maybe", "path-style"},
	}
	for _, b := range bad {
		if _, err := ParseS3URL(b.in); err == nil || !strings.Contains(err.Error(), b.says) {
			t.Errorf("ParseS3URL(%q): %v; want an error saying %q", b.in, err, b.says)
		}
	}
}

// s3Endpoint returns an S3 endpoint for a test: the store at
// EDGEBOX_TEST_S3_ENDPOINT, with the credentials in AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY, or where none is given gofakes3 in this process.
// No S3-compatible store is packaged for a fresh machine: MinIO is not,
// Debian's radosgw needs a Ceph cluster, and SeaweedFS, which this test
// passes against, builds from source with some two hundred modules and
// about ten minutes of CI's two cores. So CI runs against gofakes3: it
// answers S3's REST protocol over HTTP, and distribution's S3 driver and
// the AWS SDK on this side are the real ones.
func s3Endpoint(t *testing.T) string {
	t.Helper()
	if ep := os.Getenv("EDGEBOX_TEST_S3_ENDPOINT"); ep != "" {
		t.Logf("S3 at %s", ep)
		return ep
	}
	t.Log("S3: gofakes3 in this process (EDGEBOX_TEST_S3_ENDPOINT names a real store)")
	t.Setenv("AWS_ACCESS_KEY_ID", "edgebox-test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "edgebox-test-secret")
	srv := httptest.NewServer(gofakes3.New(s3mem.New()).Server())
	t.Cleanup(srv.Close)
	return srv.URL
}

// makeBucket makes a bucket of a name of its own at endpoint.
func makeBucket(t *testing.T, endpoint string) string {
	t.Helper()
	sess, err := session.NewSession(aws.NewConfig().WithEndpoint(endpoint).WithRegion("us-east-1").
		WithS3ForcePathStyle(true).WithDisableSSL(strings.HasPrefix(endpoint, "http://")))
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("edgebox-test-%d", time.Now().UnixNano())
	if _, err := s3.New(sess).CreateBucket(&s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestImagesInAnS3Bucket: a registry on a bucket keeps its images there,
// not in its directory: what one pushes, in parts, another on the same
// bucket with a directory of its own serves; a bucket that does not exist stops the
// registry at its start with the reason.
func TestImagesInAnS3Bucket(t *testing.T) {
	endpoint := s3Endpoint(t)
	bucket := makeBucket(t, endpoint)
	onBucket := func(dir, bucket string) Config {
		cfg := DefaultConfig(dir)
		cfg.S3 = &S3{Bucket: bucket, Prefix: "edgebox/registry", Region: "us-east-1", Endpoint: endpoint, PathStyle: true}
		return cfg
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	a := newTestRegistry(t, onBucket(dirA, bucket))
	b := newTestRegistry(t, onBucket(dirB, bucket))
	baseA := serveOperators(t, a, func(string) bool { return true }).URL
	baseB := serveOperators(t, b, func(string) bool { return true }).URL

	c := &http.Client{}
	// 12 MiB: over the driver's 10 MiB chunk, so it goes up in parts.
	blob := bytes.Repeat([]byte("a robot's layer "), 768<<10)
	loc, err := url.Parse(startUpload(t, c, baseA, "robots/clock"))
	if err != nil {
		t.Fatal(err)
	}
	if !loc.IsAbs() {
		loc, _ = url.Parse(baseA + loc.String())
	}
	finishUpload(t, c, loc, blob, "pushing a blob")
	readBlob(t, c, baseB, "robots/clock", blob, "the blob read through the other registry")
	if _, err := os.Stat(filepath.Join(dirA, "storage")); !os.IsNotExist(err) {
		t.Errorf("a registry on a bucket stored images in its directory: %v", err)
	}

	_, err = New(context.Background(), onBucket(t.TempDir(), "edgebox-no-such-bucket"), slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "cannot be used") {
		t.Fatalf("a registry on a bucket that does not exist: %v", err)
	}
}
