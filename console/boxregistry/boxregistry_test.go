package boxregistry

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/images/registry"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/opencontainers/go-digest"
	"reflect"
)

// TestRunEnds: Run serves until its context ends and returns nil then, or
// returns the listener's error when the listener fails first.
func TestRunEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		stop    func(cancel context.CancelFunc, l net.Listener)
		wantErr bool
	}{
		{"context ends", func(cancel context.CancelFunc, _ net.Listener) { cancel() }, false},
		{"listener fails", func(_ context.CancelFunc, l net.Listener) { l.Close() }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			reg, err := registry.Open(context.Background(), t.TempDir(), log)
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			s := New(reg, desired.New(storetest.Bolt(t)), []string{"console.example"}, nil, l, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- s.Run(ctx) }()

			// It serves: a request that is not over a box's tunnel gets
			// an answer, and nothing of the registry.
			hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := hc.Get("http://" + l.Addr().String() + "/v2/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode < 400 {
				t.Fatalf("a request from no box: %s, want a refusal", resp.Status)
			}

			tt.stop(cancel, l)
			select {
			case err := <-ran:
				if (err != nil) != tt.wantErr {
					t.Fatalf("Run returned %v, want an error: %v", err, tt.wantErr)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run has not returned 30s after the stop")
			}
		})
	}
}

// TestPullableNamesWorkloadsAndPrePulls: a box may pull the images its
// workloads and its rollouts' pre-pulls name in the console's registry,
// and nothing else.
func TestPullableNamesWorkloadsAndPrePulls(t *testing.T) {
	ctx := context.Background()
	st := desired.New(storetest.Bolt(t))
	d1, d2, d3 := digest.FromString("1"), digest.FromString("2"), digest.FromString("3")
	for _, o := range []*edgeboxv1.DesiredObject{
		{Name: "robot", Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{Image: "console:8443/bank/robot@" + d1.String()}}},
		{Name: "rollout-r-1", Spec: &edgeboxv1.DesiredObject_ImagePrefetch{ImagePrefetch: &edgeboxv1.ImagePrefetch{Image: "console:8443/bank/robot@" + d2.String()}}},
		{Name: "elsewhere", Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{Image: "other.example/bank/robot@" + d3.String()}}},
	} {
		o.Kind = edgeboxv1.KindOf(o)
		if _, err := st.Put(ctx, "box-1", o); err != nil {
			t.Fatal(err)
		}
	}
	got, err := pullable(st, []string{"console:8443"})(ctx, "box-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string][]digest.Digest{"bank/robot": {d2, d1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("pullable: %v, want %v", got, want)
	}
}
