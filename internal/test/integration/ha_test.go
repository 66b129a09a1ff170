//go:build linux

package integration

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
	"github.com/edgebox/edgebox/internal/test/haproxytest"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// replicaProc is a console replica run as its binary.
type replicaProc struct {
	bin, data, shared, store, public string
	addr, replicaAddr                string

	mu  sync.Mutex
	cmd *exec.Cmd
	out *lockedBuffer
}

// start runs the replica and waits for its API; it returns what the
// replica printed so far.
func (r *replicaProc) start(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(r.bin, "edgebox-console"), "--data", r.data, "--shared", r.shared,
		"--store", r.store, "--listen", r.addr, "--public-url", r.public,
		"--replica-listen", r.replicaAddr, "--replica-url", "https://"+r.replicaAddr, "--log-level", "info")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.cmd, r.out = cmd, out
	r.mu.Unlock()
	t.Cleanup(func() { r.stop(syscall.SIGKILL) })
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get("https://" + r.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return out.String()
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica on %s did not start: %v\n%s", r.addr, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the replica with sig (SIGKILL: as if its machine died).
func (r *replicaProc) stop(sig syscall.Signal) {
	r.mu.Lock()
	cmd := r.cmd
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	cmd.Wait()
}

var (
	adminTokenRE = regexp.MustCompile(`admin token:\s+(\S+)`)
	replicaIDRE  = regexp.MustCompile(`msg="console replica" .*\bid=(r-[0-9a-f]+)`)
)

// id is the replica's ID, from its log.
func (r *replicaProc) id(t *testing.T) string {
	t.Helper()
	r.mu.Lock()
	out := r.out.String()
	r.mu.Unlock()
	m := replicaIDRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("replica on %s logged no ID:\n%s", r.addr, out)
	}
	return m[1]
}

// TestThreeReplicasBehindHAProxy runs the documented deployment: three
// console replicas as binaries on a three-member etcd cluster with one
// shared directory, HAProxy in TCP mode in front of them, and boxes (agent
// binaries) that know only HAProxy's address.
//
//   - Any replica answers the API for any box: a call that needs a box's
//     tunnel, made to each replica, reaches the box.
//   - kill -9 of the replica that holds the most boxes: a session opened
//     through another replica to one of its boxes ends with an error; its
//     boxes are back online through the others; every write the API
//     confirmed before the kill, and one made after it, is on every box.
func TestThreeReplicasBehindHAProxy(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildBinaries(t)
	cluster := etcdtest.StartCluster(t, 3)
	store := "etcd://" + strings.Join(cluster.Endpoints(), ",") + "/ha-test"
	shared := t.TempDir()
	reps := make([]*replicaProc, 3)
	backends := make([]string, 3)
	for i := range reps {
		reps[i] = &replicaProc{bin: bin, data: t.TempDir(), shared: shared, store: store,
			addr: testenv.FreeAddr(t), replicaAddr: testenv.FreeAddr(t)}
		backends[i] = reps[i].addr
	}
	lb := haproxytest.Start(t, backends)
	public := "https://" + lb.Addr
	for _, r := range reps {
		r.public = public
	}
	// The first start makes the CA and the admin; the others find them.
	m := adminTokenRE.FindStringSubmatch(reps[0].start(t))
	if m == nil {
		t.Fatal("the first replica printed no admin token")
	}
	token := m[1]
	var wg sync.WaitGroup
	for _, r := range reps[1:] {
		wg.Add(1)
		go func() { defer wg.Done(); r.start(t) }()
	}
	wg.Wait()
	// HAProxy sends nothing to a replica until its checks find it up.
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	testenv.WaitFor(t, 20*time.Second, "HAProxy to find every replica up", func() bool {
		n := 0
		for range 2 * len(reps) {
			resp, err := hc.Get(public + "/healthz")
			if err == nil {
				resp.Body.Close()
				n++
			}
		}
		return n == 2*len(reps)
	})
	hc.CloseIdleConnections()
	caPEM := testenv.FetchCA(t, public)
	client := func(url string) *api.Client {
		c, err := api.NewClient(url, token, caPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	admin := client(public)
	direct := make([]*api.Client, len(reps))
	for i, r := range reps {
		direct[i] = client("https://" + r.addr)
	}

	// Six boxes, enrolled and connected through the load balancer.
	tok, err := admin.CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: "ha", Uses: 6})
	if err != nil {
		t.Fatal(err)
	}
	var boxes []testenv.Box
	for i := range 6 {
		b, err := testenv.EnrollBinary(t, tok.Text, fmt.Sprintf("ha-box-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		b.Start(t)
		boxes = append(boxes, b)
	}
	holders := func(c *api.Client) (map[string]string, bool) {
		all, err := c.Boxes(ctx(t))
		if err != nil {
			return nil, false
		}
		by := map[string]string{}
		for _, b := range all {
			if !b.Online || b.Replica == "" {
				return nil, false
			}
			by[b.ID] = b.Replica
		}
		return by, len(by) == len(boxes)
	}
	var held map[string]string
	testenv.WaitFor(t, 60*time.Second, "every box online, each held by a replica", func() bool {
		var ok bool
		held, ok = holders(admin)
		return ok
	})
	count := map[string]int{}
	for _, r := range held {
		count[r]++
	}
	t.Logf("boxes held by replica: %v", count)

	// Any replica answers for any box: the box itself says it runs no
	// such workload.
	for i, c := range direct {
		for _, b := range boxes {
			if _, err := c.Logs(ctx(t), b.ID(), "nothing-here", 10); err == nil || !strings.Contains(err.Error(), "no workload") {
				t.Fatalf("replica %d, logs of box %s (held by %s): %v", i, b.ID(), held[b.ID()], err)
			}
		}
	}

	// The victim holds the most boxes.
	victimID := ""
	for id, n := range count {
		if victimID == "" || n > count[victimID] {
			victimID = id
		}
	}
	victim, other := -1, -1
	for i, r := range reps {
		if r.id(t) == victimID {
			victim = i
		} else if other < 0 {
			other = i
		}
	}
	var onVictim string
	for id, r := range held {
		if r == victimID {
			onVictim = id
		}
	}
	if victim < 0 || other < 0 || onVictim == "" {
		t.Fatalf("no victim among the replicas (victim %d, other %d, box %q)", victim, other, onVictim)
	}

	// A session through another replica to a box of the victim.
	sess, err := direct[other].OpenSession(ctx(t), onVictim, api.SessionOptions{Command: []string{"sh", "-c", "echo ready; exec sleep 600"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var seen bytes.Buffer
	for !strings.Contains(seen.String(), "ready") {
		f, err := sess.Recv()
		if err != nil {
			t.Fatalf("the session before the kill: %v (%q)", err, seen.String())
		}
		seen.Write(f.Payload)
	}

	// Writes the API confirmed before the kill.
	confirmed := map[string]uint64{}
	for _, b := range boxes {
		rev, err := admin.PutDesired(ctx(t), b.ID(), "Workload", "robot", spec("robot", "1", "process"))
		if err != nil {
			t.Fatal(err)
		}
		confirmed[b.ID()] = rev
	}

	reps[victim].stop(syscall.SIGKILL)
	killed := time.Now()
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := sess.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		t.Logf("the session through the dead replica ended %v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatal("a session to a box of the dead replica still runs 30 s after the kill")
	}

	d := testenv.WaitFor(t, 90*time.Second, "every box online again, none on the dead replica", func() bool {
		by, ok := holders(admin)
		if !ok {
			return false
		}
		for _, r := range by {
			if r == victimID {
				return false
			}
		}
		return true
	})
	t.Logf("the dead replica's %d boxes were back through the others %v after the kill", count[victimID], d.Round(100*time.Millisecond))

	// What was confirmed is on every box, and so is a write made now.
	after := map[string]uint64{}
	for _, b := range boxes {
		rev, err := admin.PutDesired(ctx(t), b.ID(), "Workload", "robot", spec("robot", "2", "process"))
		if err != nil {
			t.Fatal(err)
		}
		after[b.ID()] = rev
		if rev <= confirmed[b.ID()] {
			t.Fatalf("box %s: the write after the kill has revision %d, the one before %d", b.ID(), rev, confirmed[b.ID()])
		}
	}
	testenv.WaitFor(t, 60*time.Second, "every box to ack every write", func() bool {
		for _, b := range boxes {
			st, err := admin.BoxState(ctx(t), b.ID())
			if err != nil || st.Acked < after[b.ID()] {
				return false
			}
		}
		return true
	})
}
