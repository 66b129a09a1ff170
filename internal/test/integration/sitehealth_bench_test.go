package integration

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
)

// BenchmarkSiteVerdicts times site health's two verdicts at the default
// probe period (10 s) and the tunnel's default liveness, for a site of
// three boxes on loopback addresses:
//
//   - line_cut_s: box 1's link to the console goes silent (toxiproxy
//     stops passing bytes but holds the connection, as a dead line does)
//     until the console says "disconnected-running";
//   - death_s: once box 1 is back, box 2's link goes silent and its agent
//     stops at the same moment, as a box losing power does, until the
//     console says "down".
//
// It takes about three minutes; make bench runs it.
func BenchmarkSiteVerdicts(b *testing.B) {
	for range b.N {
		cut, death := siteVerdictTimes(b)
		b.ReportMetric(cut.Seconds(), "line_cut_s")
		b.ReportMetric(death.Seconds(), "death_s")
	}
}

func siteVerdictTimes(b *testing.B) (cut, death time.Duration) {
	h := testenv.NewInProcess(b, testenv.Options{})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	var boxes []testenv.Box
	var links []*toxic.Proxy
	for i := range 3 {
		box, err := h.Enroll(b, h.Token(b, api.TokenRequest{Region: "east", Site: "a"}), fmt.Sprintf("shop-%d", i+1))
		if err != nil {
			b.Fatal(err)
		}
		link := toxic.New(b, strings.TrimPrefix(h.URL(), "https://"))
		testenv.StartAgent(b, box, func(c *agent.Config) {
			c.SiteListen = []string{fmt.Sprintf("127.0.0.%d:%d", i+1, port)}
			c.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, link.Addr())
			}
		})
		boxes, links = append(boxes, box), append(links, link)
	}
	health := func(id string) string { return testenv.BoxState(b, h, id).Health }
	settled := func() bool {
		for _, x := range boxes {
			if health(x.ID()) != "online" {
				return false
			}
		}
		return true
	}
	testenv.WaitFor(b, time.Minute, "the site online", settled)
	time.Sleep(30 * time.Second) // peers listed, heard, and voted on

	silence := func(l *toxic.Proxy) {
		for _, stream := range []string{"upstream", "downstream"} {
			if err := l.Add("silence-"+stream, "timeout", stream, `"timeout": 0`); err != nil {
				b.Fatal(err)
			}
		}
	}
	start := time.Now()
	silence(links[0])
	testenv.WaitFor(b, 2*time.Minute, "box 1 disconnected-running", func() bool { return health(boxes[0].ID()) == "disconnected-running" })
	cut = time.Since(start)

	// Box 1's line back: the site needs its vote on box 2.
	for _, stream := range []string{"upstream", "downstream"} {
		links[0].Remove("silence-" + stream)
	}
	testenv.WaitFor(b, 2*time.Minute, "box 1 online again", settled)
	time.Sleep(20 * time.Second) // and voting again

	start = time.Now()
	silence(links[1])
	go boxes[1].Stop(b) // its agent ends; its goodbye goes nowhere
	testenv.WaitFor(b, 2*time.Minute, "box 2 down", func() bool { return health(boxes[1].ID()) == "down" })
	death = time.Since(start)
	return cut, death
}
