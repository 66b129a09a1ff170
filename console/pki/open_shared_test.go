package pki

import (
	"bufio"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// opened is what one console learned from Open on a shared directory.
type opened struct {
	ca, pin string // hex SHA-256 of the CA's DER and of the serving key's SPKI
	created bool
	err     error
}

func openedOf(a *Authority, created bool, err error) opened {
	if err != nil {
		return opened{err: err}
	}
	ca, pin := a.CAHash(), a.KeyPin()
	return opened{ca: hex.EncodeToString(ca[:]), pin: hex.EncodeToString(pin[:]), created: created}
}

// replicaHosts are the names of replica i: its own name, which the
// shared certificate lacks when another replica wrote it, and one all
// share.
func replicaHosts(i int) []string {
	return []string{fmt.Sprintf("replica-%d.example", i), "console.example", "127.0.0.1"}
}

// TestOpenOnASharedDirMakesOneCA: consoles opening one empty directory at
// once, as goroutines of one process or as processes, each with a name of
// its own, end with one CA and one serving key: every one of them serves
// with the key and CA the directory holds, and exactly one created them.
func TestOpenOnASharedDirMakesOneCA(t *testing.T) {
	t.Parallel()
	const n = 6
	tests := []struct {
		name string
		open func(t *testing.T, dir string, i int) opened
	}{
		{"goroutines", func(t *testing.T, dir string, i int) opened {
			return openedOf(Open(dir, replicaHosts(i)))
		}},
		{"processes", func(t *testing.T, dir string, i int) opened {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "EDGEBOX_PKI_OPEN_DIR="+dir, "EDGEBOX_PKI_OPEN_REPLICA="+strconv.Itoa(i))
			out, err := cmd.Output()
			if err != nil {
				return opened{err: fmt.Errorf("%v: %s", err, out)}
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				var o opened
				if _, err := fmt.Sscanf(sc.Text(), "opened ca=%s pin=%s created=%t", &o.ca, &o.pin, &o.created); err == nil {
					return o
				}
			}
			return opened{err: fmt.Errorf("the helper printed no result: %s", out)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "pki")
			got := make([]opened, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					got[i] = tt.open(t, dir, i)
				})
			}
			close(start)
			wg.Wait()

			caCert, err := readCert(filepath.Join(dir, "ca.pem"))
			if err != nil {
				t.Fatal(err)
			}
			key, err := readKey(filepath.Join(dir, "server-key.pem"))
			if err != nil {
				t.Fatal(err)
			}
			spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
			if err != nil {
				t.Fatal(err)
			}
			caSum, pinSum := sha256.Sum256(caCert.Raw), sha256.Sum256(spki)
			wantCA, wantPin := hex.EncodeToString(caSum[:]), hex.EncodeToString(pinSum[:])
			creators := 0
			for i, o := range got {
				if o.err != nil {
					t.Fatalf("console %d: %v", i, o.err)
				}
				if o.ca != wantCA || o.pin != wantPin {
					t.Errorf("console %d serves CA %.12s… with key %.12s…; the directory holds CA %.12s… and key %.12s…",
						i, o.ca, o.pin, wantCA, wantPin)
				}
				if o.created {
					creators++
				}
			}
			if creators != 1 {
				t.Errorf("%d consoles say they created the CA, want 1", creators)
			}

			// Opened again with its own names, each gets a certificate for
			// them, still with the one key and CA.
			for i := range n {
				a, created, err := Open(dir, replicaHosts(i))
				if err != nil || created {
					t.Fatalf("console %d opening again: created=%v, %v", i, created, err)
				}
				if o := openedOf(a, false, nil); o.ca != wantCA || o.pin != wantPin {
					t.Errorf("console %d opening again serves CA %.12s… with key %.12s…", i, o.ca, o.pin)
				}
				if err := a.Server.Leaf.VerifyHostname(replicaHosts(i)[0]); err != nil {
					t.Errorf("console %d: %v", i, err)
				}
				if _, err := a.Server.Leaf.Verify(x509.VerifyOptions{Roots: a.Pool()}); err != nil {
					t.Errorf("console %d: its serving certificate is not the CA's: %v", i, err)
				}
			}
		})
	}
}

// TestMain runs the test binary as one replica of
// TestOpenOnASharedDirMakesOneCA when EDGEBOX_PKI_OPEN_DIR names the
// directory to open: it opens it as replica EDGEBOX_PKI_OPEN_REPLICA,
// prints what it serves with and exits.
func TestMain(m *testing.M) {
	dir := os.Getenv("EDGEBOX_PKI_OPEN_DIR")
	if dir == "" {
		os.Exit(m.Run())
	}
	i, _ := strconv.Atoi(os.Getenv("EDGEBOX_PKI_OPEN_REPLICA"))
	o := openedOf(Open(dir, replicaHosts(i)))
	if o.err != nil {
		fmt.Fprintln(os.Stderr, o.err)
		os.Exit(1)
	}
	fmt.Printf("opened ca=%s pin=%s created=%t\n", o.ca, o.pin, o.created)
	os.Exit(0)
}
