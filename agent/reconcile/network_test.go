package reconcile

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// addressed is the fake driver with a network: each instance that runs
// has an address and the ports its name is given in ports. (The
// containerd driver's tests show the real addresses; this checks that
// the reconciler carries them into status.)
type addressed struct {
	*fake.Driver
	ports   map[string][]string
	refused map[string]uint64
}

func (d *addressed) EgressRefused(_ context.Context, name string) (uint64, error) {
	return d.refused[name], nil
}

func (d *addressed) withNet(in runtime.Instance) runtime.Instance {
	if in.State == runtime.StateRunning {
		in.Address = "10.234.0." + string(rune('2'+len(in.Name)%8))
		in.Ports = d.ports[in.Name]
	}
	return in
}

func (d *addressed) List(ctx context.Context) ([]runtime.Instance, error) {
	l, err := d.Driver.List(ctx)
	for i := range l {
		l[i] = d.withNet(l[i])
	}
	return l, err
}

func (d *addressed) Inspect(ctx context.Context, name string) (runtime.Instance, error) {
	in, err := d.Driver.Inspect(ctx, name)
	return d.withNet(in), err
}

// TestStatusCarriesAddressAndPorts: a running workload's status has the
// address and published ports its instance has, and the connections its
// egress policy refused, and loses them when the instance goes.
func TestStatusCarriesAddressAndPorts(t *testing.T) {
	t.Parallel()
	src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
	d := &addressed{fake.New("containerd"), map[string][]string{"web": {"8080:80/tcp", "127.0.0.1:5353:53/udp"}}, map[string]uint64{}}
	b := &book{status: map[string]*edgeboxv1.ObjectStatus{}}
	r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: b, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	src.put("web", "containerd", "1")
	src.put("quiet", "containerd", "1")
	src.objs["quiet"].GetWorkload().Restart = edgeboxv1.RestartNever
	tests := []struct {
		name  string
		setup func()
		want  map[string][3]any // workload -> address, ports, refused
	}{
		{"started", func() {}, map[string][3]any{
			"web":   {"10.234.0.5", []string{"8080:80/tcp", "127.0.0.1:5353:53/udp"}, uint64(0)},
			"quiet": {"10.234.0.7", []string(nil), uint64(0)},
		}},
		{"running, web refused", func() { d.refused["web"] = 3 }, map[string][3]any{
			"web":   {"10.234.0.5", []string{"8080:80/tcp", "127.0.0.1:5353:53/udp"}, uint64(3)},
			"quiet": {"10.234.0.7", []string(nil), uint64(0)},
		}},
		{"exited with restart never", func() { d.Crash("quiet", 0) }, map[string][3]any{
			"web": {"10.234.0.5", []string{"8080:80/tcp", "127.0.0.1:5353:53/udp"}, uint64(3)},
		}},
	}
	for _, tt := range tests {
		tt.setup()
		pass(t, r)
		for _, name := range []string{"web", "quiet"} {
			st := b.status[name]
			want, ok := tt.want[name]
			if !ok {
				want = [3]any{"", []string(nil), uint64(0)}
			}
			if st.GetAddress() != want[0] || !slices.Equal(st.GetPorts(), want[1].([]string)) || st.GetEgressRefused() != want[2] {
				t.Errorf("%s: status of %s has address %q, ports %q and %d refused, want %q, %q and %d", tt.name, name,
					st.GetAddress(), st.GetPorts(), st.GetEgressRefused(), want[0], want[1], want[2])
			}
		}
	}
}
