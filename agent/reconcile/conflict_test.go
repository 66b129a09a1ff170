package reconcile

import (
	"context"
	"log/slog"
	"testing"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func testLog(t *testing.T) *slog.Logger { return slog.New(slog.NewTextHandler(t.Output(), nil)) }

// unlisted is a driver whose List does not show some instances it holds
// (made between the list and the create, or half made), and whose Create
// of a name in ghost answers a conflict though nothing of it can be
// inspected, once.
type unlisted struct {
	*fake.Driver
	hidden map[string]bool
	ghost  map[string]bool
}

func (u *unlisted) List(ctx context.Context) ([]runtime.Instance, error) {
	all, err := u.Driver.List(ctx)
	var out []runtime.Instance
	for _, in := range all {
		if !u.hidden[in.Name] {
			out = append(out, in)
		}
	}
	return out, err
}

func (u *unlisted) Create(ctx context.Context, s runtime.Spec) error {
	if u.ghost[s.Name] {
		delete(u.ghost, s.Name)
		return errdefs.Conflict("instance %s exists", s.Name)
	}
	return u.Driver.Create(ctx, s)
}

// TestCreateConflict: a Create that answers a conflict is not taken for
// a success. What is there is taken when it is the desired spec, and
// replaced when it is another, or when nothing of it can be inspected;
// the workload ends up running either way, made once.
func TestCreateConflict(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		there   string // release of the unlisted instance; "" for none
		running bool   // it runs
		ghost   bool   // Create conflicts though nothing can be inspected
		creates int    // of the desired spec
		events  map[string]int
	}{
		{name: "same spec, running", there: "1", running: true, creates: 1, events: map[string]int{"Created": 0, "Started": 0}},
		{name: "same spec, created", there: "1", creates: 1, events: map[string]int{"Created": 0, "Started": 1}},
		{name: "another spec", there: "0", running: true, creates: 1, events: map[string]int{"Created": 1, "Started": 1}},
		{name: "nothing to inspect", ghost: true, creates: 1, events: map[string]int{"Created": 1, "Started": 1, "CreateFailed": 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
			d := &unlisted{Driver: fake.New("containerd"), hidden: map[string]bool{"w": true}, ghost: map[string]bool{}}
			b := &book{status: map[string]*edgeboxv1.ObjectStatus{}}
			r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: b, Log: testLog(t)})
			if err != nil {
				t.Fatal(err)
			}
			src.put("w", "containerd", "1")
			want := runtime.NewSpec("w", src.objs["w"].GetWorkload())
			if c.there != "" {
				w := &edgeboxv1.Workload{App: "w", Release: c.there, Runtime: "containerd"}
				if err := d.Driver.Create(context.Background(), runtime.NewSpec("w", w)); err != nil {
					t.Fatal(err)
				}
				if c.running {
					d.Driver.Start(context.Background(), "w")
				}
			}
			d.ghost["w"] = c.ghost
			pass(t, r)
			if s := b.status["w"]; s.GetPhase() != "Running" {
				t.Fatalf("status %v, want Running", s)
			}
			if got := d.Running(); len(got) != 1 {
				t.Fatalf("running %v", got)
			}
			if in, _ := d.Inspect(context.Background(), "w"); in.Hash != want.Hash {
				t.Fatalf("the instance has hash %s, want the desired spec's %s", in.Hash, want.Hash)
			}
			if n := d.Creates("w", want.Hash); n != c.creates {
				t.Fatalf("the desired spec was made %d times, want %d", n, c.creates)
			}
			got := b.reasons()
			for reason, n := range c.events {
				if got[reason] != n {
					t.Errorf("%d %s events, want %d (all: %v)", got[reason], reason, n, got)
				}
			}
		})
	}
}
