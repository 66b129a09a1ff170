package apps

import (
	"context"
	"strings"
	"testing"
)

// keyless says every box but "bx-keyed" has no key for any need; it
// leases nothing.
type keyless struct{ Leaser }

func (keyless) MissingKeys(_ context.Context, _, box, _ string, needs []map[string]string) ([]string, error) {
	if box == "bx-keyed" {
		return nil, nil
	}
	var out []string
	for _, n := range needs {
		out = append(out, needText(n))
	}
	return out, nil
}

func needText(n map[string]string) string {
	var parts []string
	for k, v := range n {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// TestPreviewSaysWhatADeployWouldDo: the boxes a region deploy reaches,
// leaving out those a narrower pin keeps and revoked ones, which have the
// release already, and which lack a key; and it changes nothing.
func TestPreviewSaysWhatADeployWouldDo(t *testing.T) {
	t.Parallel()
	revoked := box("bx-gone", "east", "s3")
	revoked.State = "revoked"
	a, d := newApps(t, boxes{box("bx-keyed", "east", "s1"), box("bx-a", "east", "s1"), box("bx-b", "east", "s2"), revoked, box("bx-w", "west", "s9")})
	if _, err := a.CreateApp(ctx, admin, "clock", ""); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2"} {
		if _, err := a.CreateRelease(ctx, admin, "clock", Spec{Version: v, Runtime: "process", Image: "/bin/sleep",
			Keys: []KeyNeed{{Labels: map[string]string{"bank": "icbc"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := a.Deploy(ctx, admin, "clock", "1", ScopeBox, "bx-b"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Deploy(ctx, admin, "clock", "2", ScopeSite, "s1"); err != nil {
		t.Fatal(err)
	}
	before := len(workloads(t, d, "bx-a"))
	a.keys = keyless{} // after the deploys: they would lease
	im, err := a.Preview(ctx, admin.TenantID, "clock", "2", ScopeRegion, "east")
	if err != nil {
		t.Fatal(err)
	}
	var ids, kept []string
	for _, b := range im.Boxes {
		ids = append(ids, b.ID)
	}
	for _, b := range im.Kept {
		kept = append(kept, b.ID)
	}
	if strings.Join(ids, ",") != "bx-keyed,bx-a" || strings.Join(kept, ",") != "bx-b" || im.Already != 2 {
		t.Errorf("boxes %v (already %d), kept %v; want bx-keyed,bx-a (2), kept bx-b", ids, im.Already, kept)
	}
	if len(im.MissingKeys) != 1 || strings.Join(im.MissingKeys["bx-a"], ";") != "bank=icbc" {
		t.Errorf("missing keys %v", im.MissingKeys)
	}
	if len(workloads(t, d, "bx-a")) != before {
		t.Error("the preview changed a box's desired state")
	}
	if _, err := a.Preview(ctx, admin.TenantID, "clock", "9", ScopeRegion, "east"); err == nil {
		t.Error("a preview of a release that does not exist")
	}
}
