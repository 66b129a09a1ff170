package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/leak"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/tunnel"
)

// TestRunStopsCleanly runs an enrolled agent against a real console until
// the console sees it online, then ends its context: Run returns nil (the
// wipe's ErrWiped and every other failure are the only non-nil results)
// and every goroutine the agent started is gone. It is not parallel: it
// counts the process's goroutines.
func TestRunStopsCleanly(t *testing.T) {
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "run-test")
	if err != nil {
		t.Fatal(err)
	}
	before, _ := leak.Count()

	cfg := agent.DefaultConfig(box.DataDir())
	cfg.Version = "test"
	cfg.Backoff = tunnel.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	a, err := agent.New(cfg, testenv.Logger(t).With("side", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	testenv.WaitFor(t, 30*time.Second, "box online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })

	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run returned %v after its context ended, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run has not returned 30s after its context ended")
	}
	if st := a.Status(); st.Connected {
		t.Errorf("status after Run returned says connected: %+v", st)
	}

	n, all := leak.Settle(before, 10*time.Second)
	if n > before {
		t.Errorf("%d goroutines before the agent, %d after Run returned; all goroutines:\n%s", before, n, all)
	}
}
