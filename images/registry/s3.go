package registry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"

	"github.com/edgebox/edgebox/errdefs"
)

// S3 is an S3-compatible bucket that keeps the registry's images, through
// distribution's own S3 driver. Its credentials come from where AWS's
// tools look for them: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in
// the environment, ~/.aws/credentials, or the machine's role.
type S3 struct {
	// Bucket is the bucket's name; it must exist.
	Bucket string
	// Prefix is where in the bucket the images go; "" is its root.
	Prefix string
	// Region is the bucket's region: required on Amazon S3; with an
	// Endpoint, us-east-1 unless set.
	Region string
	// Endpoint is the service's URL, http(s)://HOST[:PORT], for a store
	// other than Amazon's (Ceph, SeaweedFS, MinIO and the like); "" is
	// Amazon S3.
	Endpoint string
	// PathStyle puts the bucket in the URL's path rather than its host
	// name, as most stores other than Amazon's want.
	PathStyle bool
}

var (
	bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
	prefixRE = regexp.MustCompile(`^[A-Za-z0-9._/-]{0,256}$`)
)

// ParseS3URL reads s3://BUCKET[/PREFIX][?region=R&endpoint=URL&path-style=true].
// A store other than Amazon's is given by its endpoint, and path style is
// then the default.
func ParseS3URL(raw string) (*S3, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.User != nil || u.Fragment != "" {
		return nil, errdefs.Invalid("registry storage %q: want s3://BUCKET[/PREFIX][?region=REGION&endpoint=URL&path-style=true]", clipURL(raw))
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "region", "endpoint", "path-style":
		default:
			return nil, errdefs.Invalid("registry storage %q: unknown setting %q (region, endpoint, path-style)", clipURL(raw), k)
		}
	}
	s := &S3{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"), Region: q.Get("region"), Endpoint: q.Get("endpoint")}
	s.PathStyle = s.Endpoint != ""
	if v := q.Get("path-style"); v != "" {
		if s.PathStyle, err = strconv.ParseBool(v); err != nil {
			return nil, errdefs.Invalid("registry storage %q: path-style=%q: want true or false", clipURL(raw), v)
		}
	}
	if s.Region == "" && s.Endpoint != "" {
		s.Region = "us-east-1"
	}
	return s, s.Validate()
}

func clipURL(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// Validate reports the first setting that cannot work.
func (s *S3) Validate() error {
	if !bucketRE.MatchString(s.Bucket) || strings.Contains(s.Bucket, "..") {
		return errdefs.Invalid("registry storage: bucket %q: use 3-63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit", clipURL(s.Bucket))
	}
	if !prefixRE.MatchString(s.Prefix) || strings.Contains(s.Prefix, "..") || strings.Contains(s.Prefix, "//") {
		return errdefs.Invalid("registry storage: prefix %q: use up to 256 letters, digits, '.', '_', '-' and '/', without '..'", clipURL(s.Prefix))
	}
	if s.Endpoint == "" && s.Region == "" {
		return errdefs.Invalid("registry storage: Amazon S3 needs the bucket's region (?region=...)")
	}
	if s.Endpoint != "" {
		u, err := url.Parse(s.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return errdefs.Invalid("registry storage: endpoint %q: want http(s)://HOST[:PORT]", clipURL(s.Endpoint))
		}
	}
	return nil
}

// String names the bucket for the log; it holds no secret.
func (s *S3) String() string {
	where := "s3://" + s.Bucket + "/" + s.Prefix
	if s.Endpoint != "" {
		return where + " at " + s.Endpoint
	}
	return where + " in " + s.Region
}

// parameters are distribution's S3 driver's settings for s.
func (s *S3) parameters() configuration.Parameters {
	p := configuration.Parameters{"bucket": s.Bucket, "region": s.Region, "forcepathstyle": s.PathStyle,
		"rootdirectory": "/" + s.Prefix, "secure": true}
	if s.Endpoint != "" {
		p["regionendpoint"] = strings.TrimSuffix(s.Endpoint, "/")
		p["secure"] = strings.HasPrefix(s.Endpoint, "https://")
	}
	return p
}

// reach lists the bucket once, so that a bucket that is missing, out of
// reach or closed to these credentials stops the console at its start
// with the reason, not at the first push.
func (s *S3) reach(ctx context.Context, d storagedriver.StorageDriver) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := d.List(ctx, "/")
	var notFound storagedriver.PathNotFoundError
	if err == nil || errors.As(err, &notFound) {
		return nil // an empty bucket has no root yet
	}
	return fmt.Errorf("registry: the images' bucket %s cannot be used: %w (credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials)", s, err)
}
