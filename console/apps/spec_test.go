package apps

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestStoredReleaseFormat: releases stored by a console of 2026-11 (when
// Release still embedded api.ReleaseSpec; the JSON below is what that code
// wrote) load unchanged, run on a box as they did, and are written the
// same way today.
func TestStoredReleaseFormat(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 17, 30, 0, 0, time.UTC)
	tests := []struct {
		name   string
		stored string
		want   Release
		run    *edgeboxv1.Workload
	}{{
		name: "every field",
		stored: `{"tenant_id":"default","app":"clock","version":"1.2","runtime":"containerd","image":"console.example:8443/robots/clock@sha256:aaaa",` +
			`"env":["A=1"],"args":["-v"],"cpu_millis":500,"memory_bytes":1048576,"restart":"on-failure","keep_state":true,` +
			`"probes":[{"exec":["true"],"period_seconds":5,"timeout_seconds":2,"failure_threshold":3,"initial_delay_seconds":7},{"http":"http://127.0.0.1:8080/healthz"},{"tcp":"127.0.0.1:9"}],` +
			`"ports":[{"name":"web","port":8080,"protocol":"tcp"},{"port":53,"protocol":"udp"}],"keys":[{"labels":{"bank":"icbc"}}],` +
			`"volumes":[{"name":"data","path":"/data","read_only":true},{"name":"logs","path":"/var/log/clock"}],` +
			`"tag":"1.2","created_at":"2026-11-24T17:30:00Z","created_by":"admin"}`,
		want: Release{TenantID: "default", App: "clock", Spec: Spec{Version: "1.2", Runtime: "containerd",
			Image: "console.example:8443/robots/clock@sha256:aaaa", Env: []string{"A=1"}, Args: []string{"-v"}, CPUMillis: 500, MemoryBytes: 1 << 20,
			Restart: "on-failure", KeepState: true,
			Probes: []Probe{{Exec: []string{"true"}, PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: 3, InitialDelay: 7},
				{HTTP: "http://127.0.0.1:8080/healthz"}, {TCP: "127.0.0.1:9"}},
			Ports:   []Port{{Name: "web", Port: 8080, Protocol: "tcp"}, {Port: 53, Protocol: "udp"}},
			Keys:    []KeyNeed{{Labels: map[string]string{"bank": "icbc"}}},
			Volumes: []Volume{{Name: "data", Path: "/data", ReadOnly: true}, {Name: "logs", Path: "/var/log/clock"}}},
			Tag: "1.2", CreatedAt: at, CreatedBy: "admin"},
		run: &edgeboxv1.Workload{App: "clock", Release: "1.2", Runtime: "containerd", Image: "console.example:8443/robots/clock@sha256:aaaa",
			Env: []string{"A=1"}, Args: []string{"-v"}, CpuMillis: 500, MemoryBytes: 1 << 20, Restart: "on-failure", KeepState: true,
			Probes: []*edgeboxv1.Probe{{Exec: []string{"true"}, PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: 3, InitialDelaySeconds: 7},
				{Http: "http://127.0.0.1:8080/healthz"}, {Tcp: "127.0.0.1:9"}},
			Volumes: []*edgeboxv1.Volume{{Name: "data", Path: "/data", ReadOnly: true}, {Name: "logs", Path: "/var/log/clock"}}},
	}, {
		name:   "process, nothing optional",
		stored: `{"tenant_id":"default","app":"tool","version":"1","runtime":"process","image":"/bin/true","created_at":"2026-11-24T17:30:00Z","created_by":"admin"}`,
		want:   Release{TenantID: "default", App: "tool", Spec: Spec{Version: "1", Runtime: "process", Image: "/bin/true"}, CreatedAt: at, CreatedBy: "admin"},
		run:    &edgeboxv1.Workload{App: "tool", Release: "1", Runtime: "process", Image: "/bin/true"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bx := box("bx-a", "east", "s1")
			a, d := newApps(t, boxes{bx})
			if _, err := a.CreateApp(ctx, admin, tt.want.App, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Put(ctx, a.s, relKey(fleet.DefaultTenant, tt.want.App, tt.want.Version), []byte(tt.stored)); err != nil {
				t.Fatal(err)
			}
			got, err := a.Release(ctx, fleet.DefaultTenant, tt.want.App, tt.want.Version)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("loaded\n%+v\nwant\n%+v", got, tt.want)
			}
			if rels, err := a.Releases(ctx, fleet.DefaultTenant, tt.want.App); err != nil || len(rels) != 1 || !reflect.DeepEqual(rels[0], tt.want) {
				t.Errorf("listed %+v, %v", rels, err)
			}
			// What is written today is what was written then.
			if raw, err := json.Marshal(tt.want); err != nil || string(raw) != tt.stored {
				t.Errorf("written as\n%s\nwant\n%s (%v)", raw, tt.stored, err)
			}
			if _, _, err := a.Deploy(ctx, admin, tt.want.App, tt.want.Version, ScopeRegion, "east"); err != nil {
				t.Fatal(err)
			}
			if w := workloads(t, d, bx.ID)[tt.want.App]; !proto.Equal(w, tt.run) {
				t.Errorf("the box runs\n%v\nwant\n%v", w, tt.run)
			}
		})
	}
}
