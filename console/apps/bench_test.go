package apps

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/edgebox/edgebox/console/store/storetest"
)

// BenchmarkHelloSync is a box's app sync at its hello, with nothing to
// change, against the size of its tenant's catalogue: read at every
// hello ("each") or kept until it changes ("kept").
//
//	go test -run '^$' -bench HelloSync ./console/apps/
func BenchmarkHelloSync(b *testing.B) {
	for _, releases := range []int{10, 100, 1000} {
		for _, kept := range []bool{false, true} {
			name := fmt.Sprintf("releases=%d/each", releases)
			if kept {
				name = fmt.Sprintf("releases=%d/kept", releases)
			}
			b.Run(name, func(b *testing.B) {
				s := &storetest.Observed{Store: storetest.Bolt(b), Prefix: "apps/"}
				bx := box("bx-a", "east", "s1")
				a, _ := newAppsOn(b, s, boxes{bx})
				// Ten apps, their releases shared among them.
				for i := range 10 {
					a.CreateApp(ctx, admin, "app"+strconv.Itoa(i), "")
				}
				for i := range releases {
					app := "app" + strconv.Itoa(i%10)
					if _, err := a.CreateRelease(ctx, admin, app, Spec{Version: strconv.Itoa(i), Runtime: "containerd", Image: "robots/clock:1"}); err != nil {
						b.Fatal(err)
					}
				}
				for i := range 10 {
					if _, _, err := a.Deploy(ctx, admin, "app"+strconv.Itoa(i), strconv.Itoa(i), ScopeRegion, "east"); err != nil {
						b.Fatal(err)
					}
				}
				if kept {
					storetest.Run(b, a.Run)
					s.Settle(b, 0, "a kept catalogue", func() { a.SyncBox(ctx, bx) })
				}
				b.ResetTimer()
				for b.Loop() {
					if n, err := a.SyncBox(ctx, bx); n != 0 || err != nil {
						b.Fatalf("a sync with nothing to change: %d, %v", n, err)
					}
				}
			})
		}
	}
}
