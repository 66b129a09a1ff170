package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestAConsoleOnEtcd: a console whose records are on etcd (--store
// etcd://…) enrolls a box, deploys to it, and, started again, finds its
// users, the box and its desired state there: the box comes back and
// runs what it ran, and nothing went into a database in the data
// directory.
func TestAConsoleOnEtcd(t *testing.T) {
	t.Parallel()
	etcd := "etcd://" + etcdtest.Start(t) + "/console-test"
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) { c.Store = etcd }})
	box := enrollOne(t, h, "on-etcd")
	drv := fake.New("containerd")
	testenv.StartAgent(t, box, withDriver(drv))
	admin := h.Admin()
	if _, err := admin.Label(ctx(t), box.ID(), map[string]string{"bank": "icbc"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.PutDesired(ctx(t), box.ID(), "Workload", "robot", spec("robot", "1", "containerd")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the robot running", func() bool { return len(drv.Running()) == 1 })

	h.RestartConsole(t)
	testenv.WaitFor(t, 30*time.Second, "the box online with the console started again", func() bool {
		b, err := admin.Box(ctx(t), box.ID())
		return err == nil && b.Online
	})
	b, err := admin.Box(ctx(t), box.ID())
	if err != nil {
		t.Fatal(err)
	}
	if b.Labels["bank"] != "icbc" {
		t.Errorf("the box's labels after the restart: %v", b.Labels)
	}
	st, err := admin.BoxState(ctx(t), box.ID())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Objects) != 1 || st.Objects[0].Name != "robot" {
		t.Errorf("the box's desired state after the restart: %+v", st.Objects)
	}
	if _, err := admin.PutDesired(ctx(t), box.ID(), "Workload", "robot", spec("robot", "2", "containerd")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "release 2 acked", func() bool {
		st, err := admin.BoxState(ctx(t), box.ID())
		return err == nil && st.Acked == st.Revision && st.Revision > 0
	})
	if _, err := os.Stat(filepath.Join(h.DataDir(), "console.db")); !os.IsNotExist(err) {
		t.Errorf("a console on etcd made a database in its data directory: %v", err)
	}
}

// TestConsolesOnOneEtcdRunTheControllersOnce: a second console on the
// same etcd runs none of the once-only controllers while the first
// leads them, and all of them once the first stops.
func TestConsolesOnOneEtcdRunTheControllersOnce(t *testing.T) {
	t.Parallel()
	etcd := "etcd://" + etcdtest.Start(t) + "/two-consoles"
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) { c.Store = etcd }})
	cfg := console.DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.Store, cfg.Out = t.TempDir(), "127.0.0.1:0", etcd, io.Discard
	second := runConsole(t, cfg, "second console")
	// The second console's CA is its own; the store, and so the admin's
	// token, are shared.
	metricsOf := func(url string) string {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+h.AdminToken())
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	controllers := []string{"alerts", "app-sync", "compaction", "rollouts"}
	leads := func(url string) (n int) {
		m := metricsOf(url)
		for _, c := range controllers {
			if strings.Contains(m, `edgebox_console_leader{controller="`+c+`"} 1`) {
				n++
			}
		}
		return n
	}
	secondURL := "https://" + second.Addr().String()
	testenv.WaitFor(t, 20*time.Second, "the first console leading every controller", func() bool { return leads(h.URL()) == len(controllers) })
	if n := leads(secondURL); n != 0 {
		t.Fatalf("the second console leads %d controllers beside the first", n)
	}
	h.StopConsole()
	d := testenv.WaitFor(t, 20*time.Second, "the second console leading every controller", func() bool { return leads(secondURL) == len(controllers) })
	t.Logf("the second console led every controller %v after the first stopped", d.Round(10*time.Millisecond))
}

// TestAConsoleWhoseEtcdIsGoneSaysSo: with its etcd gone, an operator's
// call is answered within seconds that the store does not answer (503),
// not held, and the console keeps serving what needs no store.
func TestAConsoleWhoseEtcdIsGoneSaysSo(t *testing.T) {
	t.Parallel()
	srv := etcdtest.StartServer(t)
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) { c.Store = "etcd://" + srv.Endpoint }})
	box := enrollOne(t, h, "etcd-gone")
	admin := h.Admin()
	srv.Stop()
	start := time.Now()
	_, err := admin.Label(ctx(t), box.ID(), map[string]string{"bank": "icbc"})
	if err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("a write with the store gone: %v", err)
	}
	var apiErr *api.StatusError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable {
		t.Errorf("a write with the store gone: %v, want a 503", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("the write took %v to be refused", d)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(10*time.Millisecond), err)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second}
	resp, err := hc.Get(h.URL() + "/healthz")
	if err != nil {
		t.Fatalf("healthz with the store gone: %v", err)
	}
	resp.Body.Close()
}

// TestReplicasServeEachOthersBoxes: two console replicas on one etcd,
// sharing a CA, a box's tunnel on the first. The second knows the box is
// online, and a call that needs its tunnel (logs, a command) made to the
// second is served by the first, forwarded over mutual TLS between them;
// its user sees no difference.
func TestReplicasServeEachOthersBoxes(t *testing.T) {
	t.Parallel()
	etcd := "etcd://" + etcdtest.Start(t) + "/replicas"
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) { c.Store, c.ReplicaListen = etcd, "127.0.0.1:0" }})
	box := enrollOne(t, h, "replicated")
	testenv.StartAgent(t, box, withDriver(fake.New("containerd")))

	_, admin2 := secondReplica(t, h, etcd, nil)
	testenv.WaitFor(t, 20*time.Second, "the second replica to see the box online", func() bool {
		b, err := admin2.Box(ctx(t), box.ID())
		return err == nil && b.Online
	})

	// The box itself answers a logs call made to the second replica.
	if _, err := admin2.Logs(ctx(t), box.ID(), "nothing-here", 10); err == nil || !strings.Contains(err.Error(), "no workload") {
		t.Fatalf("logs through the second replica: %v", err)
	}
	// A command runs on the box through the second replica.
	s, err := admin2.OpenSession(ctx(t), box.ID(), api.SessionOptions{Command: []string{"sh", "-c", "echo forwarded-$((6*7))"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out strings.Builder
	for !strings.Contains(out.String(), "forwarded-42") {
		f, err := s.Recv()
		if err != nil {
			t.Fatalf("the command through the second replica: %v (%q)", err, out.String())
		}
		if f.Type == api.FrameOutput {
			out.Write(f.Payload)
		}
	}

	// A session that runs on the first replica is ended through the
	// second.
	long, err := admin2.OpenSession(ctx(t), box.ID(), api.SessionOptions{Command: []string{"sh", "-c", "exec sleep 600"}})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	id := ""
	for id == "" {
		f, err := long.Recv()
		if err != nil {
			t.Fatalf("the long session: %v", err)
		}
		if f.Type == api.FrameStatus && strings.Contains(string(f.Payload), `"session":"`) {
			id = strings.Split(strings.Split(string(f.Payload), `"session":"`)[1], `"`)[0]
		}
	}
	if err := admin2.EndSession(ctx(t), id); err != nil {
		t.Fatalf("ending through the second replica a session the first runs: %v", err)
	}
	for {
		f, err := long.Recv()
		if err != nil || f.Type == api.FrameExit {
			break
		}
	}

	// Revoked through the second replica, the box loses its tunnel on
	// the first.
	if _, err := admin2.Revoke(ctx(t), box.ID()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the revoked box's tunnel to end", func() bool {
		b, err := h.Admin().Box(ctx(t), box.ID())
		return err == nil && !b.Online
	})
}

// TestAConsoleOnAClusterThatLosesMembers: a console on a three-member
// etcd cluster with a box online. One member lost: nothing stops. Two
// lost: a write is refused within seconds saying the quorum is lost,
// reads are still answered and the box's tunnel stays up. Both back: the
// next write goes through and reaches the box.
func TestAConsoleOnAClusterThatLosesMembers(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartCluster(t, 3)
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.Store = "etcd://" + strings.Join(cluster.Endpoints(), ",") + "/quorum"
	}})
	box := enrollOne(t, h, "quorum")
	testenv.StartAgent(t, box, withDriver(fake.New("containerd")))
	admin := h.Admin()
	testenv.WaitFor(t, 20*time.Second, "the box online", func() bool {
		b, err := admin.Box(ctx(t), box.ID())
		return err == nil && b.Online
	})
	write := func(release string) (uint64, error) {
		return admin.PutDesired(ctx(t), box.ID(), "Workload", "robot", spec("robot", release, "containerd"))
	}

	cluster.Members[0].Stop()
	if _, err := write("1"); err != nil {
		t.Fatalf("a write with one member of three gone: %v", err)
	}

	cluster.Members[1].Stop()
	start := time.Now()
	_, err := write("2")
	var apiErr *api.StatusError
	if err == nil || !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "quorum") {
		t.Fatalf("a write with two members of three gone: %v, want a 503 that names the lost quorum", err)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(10*time.Millisecond), err)
	b, err := admin.Box(ctx(t), box.ID())
	if err != nil {
		t.Fatalf("a read with two members of three gone: %v", err)
	}
	if !b.Online {
		t.Fatal("the box's tunnel went down with the quorum")
	}
	if st, err := admin.BoxState(ctx(t), box.ID()); err != nil || len(st.Objects) != 1 {
		t.Fatalf("the box's state with two members of three gone: %+v, %v", st, err)
	}

	cluster.Members[0].Restart()
	cluster.Members[1].Restart()
	var rev uint64
	testenv.WaitFor(t, 60*time.Second, "a write to go through again", func() bool {
		rev, err = write("3")
		return err == nil
	})
	testenv.WaitFor(t, 30*time.Second, "the box to ack it", func() bool {
		st, err := admin.BoxState(ctx(t), box.ID())
		return err == nil && st.Acked >= rev
	})
}

// secondReplica runs another console replica on etcd beside h's, adjusted
// by adjust when set, and returns it with an admin's client of its API.
// It shares h's CA and serving key, as replicas with --shared do.
func secondReplica(t *testing.T, h *testenv.InProcess, etcd string, adjust func(*console.Config)) (*console.Console, *api.Client) {
	t.Helper()
	cfg := console.DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.Store, cfg.ReplicaListen, cfg.Out = t.TempDir(), "127.0.0.1:0", etcd, "127.0.0.1:0", io.Discard
	if adjust != nil {
		adjust(&cfg)
	}
	if err := os.CopyFS(filepath.Join(cfg.DataDir, "pki"), os.DirFS(filepath.Join(h.DataDir(), "pki"))); err != nil {
		t.Fatal(err)
	}
	second := runConsole(t, cfg, "second replica")
	admin, err := api.NewClient("https://"+second.Addr().String(), h.AdminToken(), h.CAPEM())
	if err != nil {
		t.Fatal(err)
	}
	return second, admin
}

// runConsole runs a console of cfg in the test's process until the test
// ends, and returns it once it serves; side names it in the log.
func runConsole(t *testing.T, cfg console.Config, side string) *console.Console {
	t.Helper()
	c, err := console.New(cfg, testenv.Logger(t).With("side", side))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("the %s's Run: %v", side, err)
		}
	})
	<-c.Ready()
	return c
}
