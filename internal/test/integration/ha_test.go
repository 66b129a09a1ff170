//go:build linux

package integration

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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

// stop ends the replica with sig (SIGKILL: as if its machine died) and
// returns how it exited: nil for a clean exit. A replica still running
// 30 s after sig is killed, and stop says so. Stopping a stopped replica
// does nothing.
func (r *replicaProc) stop(sig syscall.Signal) error {
	r.mu.Lock()
	cmd := r.cmd
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("still running 30 s after %v; killed", sig)
	}
}

// log is what the replica's current run wrote so far.
func (r *replicaProc) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		return ""
	}
	return r.out.String()
}

var (
	adminTokenRE = regexp.MustCompile(`admin token:\s+(\S+)`)
	replicaIDRE  = regexp.MustCompile(`msg="console replica" .*\bid=(r-[0-9a-f]+)`)
)

// id is the replica's ID, from its log.
func (r *replicaProc) id(t *testing.T) string {
	t.Helper()
	out := r.log()
	m := replicaIDRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("replica on %s logged no ID:\n%s", r.addr, out)
	}
	return m[1]
}

// haDeployment is the deployment of docs/ha.md, run by a test: console
// replicas as binaries on a three-member etcd cluster with one shared
// directory, HAProxy in TCP mode in front of them.
type haDeployment struct {
	reps []*replicaProc
	lb   *haproxytest.Proxy
	// public is HAProxy's URL, the only one boxes know.
	public string
	token  string // the admin's API token
	caPEM  []byte
	// admin calls the API through HAProxy; direct[i] calls reps[i].
	admin  *api.Client
	direct []*api.Client
}

// startReplicas starts n replicas behind HAProxy: the first alone, which
// makes the CA and the admin, then the others, which find them. It
// returns once HAProxy sends connections to every replica.
func startReplicas(t *testing.T, n int) *haDeployment {
	t.Helper()
	bin := testenv.BuildBinaries(t)
	cluster := etcdtest.StartCluster(t, 3)
	store := "etcd://" + strings.Join(cluster.Endpoints(), ",") + "/ha-test"
	shared := t.TempDir()
	d := &haDeployment{reps: make([]*replicaProc, n)}
	backends := make([]string, n)
	for i := range d.reps {
		d.reps[i] = &replicaProc{bin: bin, data: t.TempDir(), shared: shared, store: store,
			addr: testenv.FreeAddr(t), replicaAddr: testenv.RestartableAddr(t)}
		backends[i] = d.reps[i].addr
	}
	d.lb = haproxytest.Start(t, backends)
	d.public = "https://" + d.lb.Addr
	for _, r := range d.reps {
		r.public = d.public
	}
	// The first start makes the CA and the admin; the others find them.
	m := adminTokenRE.FindStringSubmatch(d.reps[0].start(t))
	if m == nil {
		t.Fatal("the first replica printed no admin token")
	}
	d.token = m[1]
	var wg sync.WaitGroup
	for _, r := range d.reps[1:] {
		wg.Add(1)
		go func() { defer wg.Done(); r.start(t) }()
	}
	wg.Wait()
	// HAProxy sends nothing to a replica until its checks find it up.
	for i := range d.reps {
		d.waitRouted(t, i, 20*time.Second)
	}
	d.caPEM = testenv.FetchCA(t, d.public)
	d.admin = d.client(t, d.public)
	d.direct = make([]*api.Client, n)
	for i, r := range d.reps {
		d.direct[i] = d.client(t, "https://"+r.addr)
	}
	return d
}

// client is a client of the admin's, of the console at url, with its own
// connections.
func (d *haDeployment) client(t *testing.T, url string) *api.Client {
	t.Helper()
	c, err := api.NewClient(url, d.token, d.caPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitRouted waits until HAProxy finds replica i up and sends it
// connections, and returns how long that took.
func (d *haDeployment) waitRouted(t *testing.T, i int, timeout time.Duration) time.Duration {
	t.Helper()
	var last string
	var lastErr error
	start := time.Now()
	for {
		last, lastErr = d.lb.Status(d.reps[i].addr)
		if lastErr == nil && last == "UP" {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("HAProxy does not route to replica %d on %s %v after it started: its state is %q (%v)", i, d.reps[i].addr, timeout, last, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// enrollBoxes enrolls n boxes, agent binaries named prefix-0, prefix-1…,
// through HAProxy, and starts them.
func (d *haDeployment) enrollBoxes(t *testing.T, n int, prefix string) []testenv.Box {
	return d.enrollBoxesWithUIDs(t, n, prefix, 0)
}

// enrollBoxesWithUIDs is enrollBoxes for boxes that run native workloads
// when firstUID is not 0: each agent gets 10,000 workload users of its
// own from firstUID (an agent ends the processes of its range it does
// not know), and its data directory lets them through.
func (d *haDeployment) enrollBoxesWithUIDs(t *testing.T, n int, prefix string, firstUID int) []testenv.Box {
	t.Helper()
	tok, err := d.admin.CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: "ha", Uses: n})
	if err != nil {
		t.Fatal(err)
	}
	var boxes []testenv.Box
	for i := range n {
		b, err := testenv.EnrollBinary(t, tok.Text, fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			t.Fatal(err)
		}
		if firstUID == 0 {
			b.Start(t)
		} else {
			openToWorkloads(b.DataDir())
			testenv.StartAgentArgs(t, b, "--workload-uids", strconv.Itoa(firstUID+i*10_000))
		}
		boxes = append(boxes, b)
	}
	return boxes
}

// openToWorkloads lets the users of a box's workloads through dir, a
// box's data directory, and the directories above it up to the system's
// temporary one.
func openToWorkloads(dir string) {
	for ; dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		os.Chmod(dir, 0o711)
	}
}

// holders is the replica holding each box, as c answers: ok when all n
// boxes are online, each held by a replica.
func holders(t *testing.T, c *api.Client, n int) (map[string]string, bool) {
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
	return by, len(by) == n
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
	ha := startReplicas(t, 3)
	reps, admin, direct := ha.reps, ha.admin, ha.direct

	// Six boxes, enrolled and connected through the load balancer.
	boxes := ha.enrollBoxes(t, 6, "ha-box")
	var held map[string]string
	testenv.WaitFor(t, 60*time.Second, "every box online, each held by a replica", func() bool {
		var ok bool
		held, ok = holders(t, admin, len(boxes))
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
		if !errors.Is(err, api.ErrSessionLost) {
			t.Errorf("the session ended with %v, want api.ErrSessionLost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a session to a box of the dead replica still runs 30 s after the kill")
	}

	d := testenv.WaitFor(t, 90*time.Second, "every box online again, none on the dead replica", func() bool {
		by, ok := holders(t, admin, len(boxes))
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
