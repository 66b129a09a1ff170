package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime/fake"
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
