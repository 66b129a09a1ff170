package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/apps"
)

// TestReleaseSpecConversion: a release spec that goes through storage and
// back comes out as the operator gave it, every field included. A field
// added to api.ReleaseSpec (or to a type inside it) must be filled in the
// table, so it cannot be forgotten by the conversion.
func TestReleaseSpecConversion(t *testing.T) {
	t.Parallel()
	full := api.ReleaseSpec{Version: "1.2", Runtime: "containerd", Image: "robots/clock:1",
		Env: []string{"A=1"}, Args: []string{"-v"}, CPUMillis: 500, MemoryBytes: 1 << 20, Restart: "on-failure", KeepState: true,
		Probes: []api.Probe{{Exec: []string{"true"}, HTTP: "http://127.0.0.1/", TCP: "127.0.0.1:9", PeriodSeconds: 5,
			TimeoutSeconds: 2, FailureThreshold: 3, InitialDelay: 7}},
		Ports:   []api.Port{{Name: "web", Port: 8080, Protocol: "udp", HostPort: 18080, HostIP: "127.0.0.1"}},
		Keys:    []api.KeyNeed{{Labels: map[string]string{"bank": "icbc"}}},
		Volumes: []api.Volume{{Name: "data", Path: "/data", ReadOnly: true}},
		Network: "bridge", Egress: []string{"bank.test"}, ProxyEnv: true, KeysHoldUpdates: true}
	if z := zeroFields(reflect.ValueOf(full), "ReleaseSpec"); len(z) > 0 {
		t.Fatalf("fill %v in the table, and convert them in release.go", z)
	}
	tests := []struct {
		name string
		spec api.ReleaseSpec
	}{
		{"every field", full},
		{"nothing optional", api.ReleaseSpec{Version: "1", Runtime: "process", Image: "/bin/true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			raw, err := json.Marshal(specFrom(tt.spec))
			if err != nil {
				t.Fatal(err)
			}
			var stored apps.Spec
			if err := json.Unmarshal(raw, &stored); err != nil {
				t.Fatal(err)
			}
			if got := specView(stored); !reflect.DeepEqual(got, tt.spec) {
				t.Errorf("came back as\n%+v\nwant\n%+v", got, tt.spec)
			}
			// The view owns its slices and maps: changing it leaves the
			// stored release alone.
			view := specView(stored)
			if len(view.Keys) > 0 {
				view.Keys[0].Labels["bank"] = "other"
				view.Env[0] = "B=2"
				view.Egress[0] = "other.test"
				if stored.Keys[0].Labels["bank"] != "icbc" || stored.Env[0] != "A=1" || stored.Egress[0] != "bank.test" {
					t.Error("the view shares its maps or slices with the stored release")
				}
			}
		})
	}
}

// zeroFields names the fields of v, and of the structs in its slices, that
// hold their zero value.
func zeroFields(v reflect.Value, path string) []string {
	var out []string
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			out = append(out, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		for i := range v.Len() {
			out = append(out, zeroFields(v.Index(i), path+"[]")...)
		}
	default:
		if v.IsZero() {
			out = append(out, path)
		}
	}
	return out
}
