package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestReplicasStartedAtOnceShareTheCAAndTheRegistry: two console
// replicas on one etcd and one --shared directory, started at the same
// moment on nothing, serve with one CA and one serving key (what boxes
// and install scripts pin), one of them made the admin user, and an image
// pushed through one replica's registry is pulled whole through the
// other's.
func TestReplicasStartedAtOnceShareTheCAAndTheRegistry(t *testing.T) {
	t.Parallel()
	etcd := "etcd://" + etcdtest.Start(t) + "/shared"
	shared := filepath.Join(t.TempDir(), "shared") // made by the consoles
	const n = 2
	type replica struct {
		c   *console.Console
		out bytes.Buffer // the first-start message, written by New
		url string
	}
	reps := make([]*replica, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		reps[i] = &replica{}
		wg.Go(func() {
			cfg := console.DefaultConfig()
			cfg.DataDir, cfg.SharedDir, cfg.Store = t.TempDir(), shared, etcd
			cfg.Listen, cfg.ReplicaListen, cfg.Out = "127.0.0.1:0", "127.0.0.1:0", &reps[i].out
			<-start
			reps[i].c, errs[i] = console.New(cfg, testenv.Logger(t).With("side", "replica "+string(rune('a'+i))))
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	for _, r := range reps {
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.c.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("a replica's Run: %v", err)
			}
		})
		<-r.c.Ready()
		r.url = "https://" + r.c.Addr().String()
	}

	// One replica made and printed the admin's credentials; another that
	// printed some too says they were not stored.
	var token, printedCA string
	for i, r := range reps {
		out := r.out.String()
		t.Logf("replica %d printed:\n%s", i, out)
		m := regexp.MustCompile(`admin token:\s+(\S+)`).FindStringSubmatch(out)
		if m == nil || strings.Contains(out, "were not stored") {
			continue
		}
		if token != "" {
			t.Fatal("both replicas printed stored admin credentials")
		}
		token = m[1]
		printedCA = regexp.MustCompile(`CA sha256:\s+([0-9a-f]{64})`).FindStringSubmatch(out)[1]
	}
	if token == "" {
		t.Fatal("no replica printed stored admin credentials")
	}

	// What a box or an install script sees of each: the CA at the end of
	// the served chain, and the serving key it pins.
	caPEM := testenv.FetchCA(t, reps[0].url)
	var firstPin string
	for i, r := range reps {
		ca, pin := servedPins(t, r.c.Addr().String())
		t.Logf("replica %d serves CA sha256 %s, key sha256 %s", i, ca, pin)
		if ca != printedCA {
			t.Errorf("replica %d serves CA sha256 %s; the CA made at the first start is %s", i, ca, printedCA)
		}
		if i == 0 {
			firstPin = pin
		} else if pin != firstPin {
			t.Errorf("replica %d serves key sha256 %s; replica 0 serves %s", i, pin, firstPin)
		}
		if got := testenv.FetchCA(t, r.url); !bytes.Equal(got, caPEM) {
			t.Errorf("replica %d gives out another CA at /api/v1/ca:\n%s", i, got)
		}
	}

	// Pushed through the first replica's registry, pulled through the
	// second's, verified layer by layer.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	defer tr.CloseIdleConnections()
	auth := remote.WithAuth(&authn.Basic{Username: "edgebox", Password: token})
	img, err := random.Image(64<<10, 3)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := name.ParseReference(strings.TrimPrefix(reps[0].url, "https://") + "/robots/shared:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(pushed, img, remote.WithTransport(tr), auth); err != nil {
		t.Fatalf("pushing through replica 0: %v", err)
	}
	want, _ := img.Digest()
	pulled, err := name.ParseReference(strings.TrimPrefix(reps[1].url, "https://") + "/robots/shared:1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(pulled, remote.WithTransport(tr), auth)
	if err != nil {
		t.Fatalf("pulling through replica 1: %v", err)
	}
	if d, err := got.Digest(); err != nil || d != want {
		t.Fatalf("replica 1 gives robots/shared:1 as %v (%v); replica 0 was pushed %v", d, err, want)
	}
	if err := validate.Image(got); err != nil {
		t.Fatalf("the image pulled through replica 1: %v", err)
	}
}

// servedPins handshakes with the console at addr as a box does before it
// trusts it, and returns the SHA-256 of the CA that ends the served chain
// and of the serving key's SubjectPublicKeyInfo, in hex.
func servedPins(t *testing.T, addr string) (ca, key string) {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	chain := conn.ConnectionState().PeerCertificates
	if len(chain) < 2 || !chain[len(chain)-1].IsCA {
		t.Fatalf("%s serves a chain of %d certificates that does not end with its CA", addr, len(chain))
	}
	caSum := sha256.Sum256(chain[len(chain)-1].Raw)
	keySum := sha256.Sum256(chain[0].RawSubjectPublicKeyInfo)
	return hex.EncodeToString(caSum[:]), hex.EncodeToString(keySum[:])
}
