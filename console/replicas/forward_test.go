package replicas

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
)

// asked is a replica of an Ask test: its Set, and a replica listener
// serving h.
type asked struct {
	set  *Set
	cert *pki.ReplicaCert
}

func startAsked(t *testing.T, endpoint string, ca *pki.Authority, id string, h http.Handler) asked {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	if h == nil { // a replica registered, and gone
		ln.Close()
	}
	set, err := Start(context.Background(), Config{Client: client(t, endpoint), Prefix: "/edgebox/", TTL: 2 * time.Second,
		Self: Replica{ID: id, Name: "console " + id, URL: url}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	cert, err := ca.ReplicaCert(id, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if h != nil {
		serve(t, ln, ListenerTLS(cert, ca.Pool()), ServeReplicas(h))
	}
	return asked{set: set, cert: cert}
}

// TestAskGathersTheOthersAnswers: a replica asks the three others. One
// answers, one fails the call, one is registered but gone: the answer
// comes with an error naming the two others and why. The asker never asks
// itself, and an answer past the limit is refused.
func TestAskGathersTheOthersAnswers(t *testing.T) {
	ep := etcdtest.Start(t)
	ca := authority(t)
	var selfAsked atomic.Int32
	a := startAsked(t, ep, ca, "r-a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { selfAsked.Add(1) }))
	startAsked(t, ep, ca, "r-b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/ask" || r.Method != http.MethodPost || r.Header.Get(ForwardedByHeader) != "r-a" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		w.Write(append([]byte("b heard "), body...))
	}))
	startAsked(t, ep, ca, "r-c", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not now", http.StatusServiceUnavailable)
	}))
	startAsked(t, ep, ca, "r-d", nil)
	waitFor(t, "r-a to know the three others", func() bool { return len(a.set.IDs()) == 4 })

	f := NewForwarder(a.set, a.cert, ca.Pool(), slog.New(slog.DiscardHandler))
	answers, err := f.Ask(context.Background(), "/ask", []byte(`{"q":1}`), 2*time.Second, 1<<10)
	if len(answers) != 1 || string(answers[0]) != `b heard {"q":1}` {
		t.Fatalf("answers: %q", answers)
	}
	if err == nil || !strings.Contains(err.Error(), "r-c") || !strings.Contains(err.Error(), "503") ||
		!strings.Contains(err.Error(), "r-d") || strings.Contains(err.Error(), "r-b") {
		t.Fatalf("the error: %v; want r-c's 503 and r-d named, and not r-b", err)
	}
	if n := selfAsked.Load(); n != 0 {
		t.Fatalf("the asker asked itself %d times", n)
	}
	if answers, err := f.Ask(context.Background(), "/ask", []byte(strings.Repeat("x", 100)), 2*time.Second, 50); len(answers) != 0 ||
		err == nil || !strings.Contains(err.Error(), "longer than 50 bytes") {
		t.Fatalf("an answer past the limit: %q, %v", answers, err)
	}
}
