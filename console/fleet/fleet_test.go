package fleet

import (
	"crypto/sha256"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/db"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/boltdb"
)

func openFleet(t *testing.T, dir string) (*Fleet, *bolt.DB) {
	t.Helper()
	bdb, err := db.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The database must be consistent after every test.
		if err := boltdb.Check(bdb); err != nil {
			t.Errorf("bbolt check: %v", err)
		}
		bdb.Close()
	})
	f, err := New(bdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f, bdb
}

var admin = audit.Actor{TenantID: DefaultTenant, Name: "admin", Remote: "127.0.0.1"}

func issue(string) ([]byte, time.Time, error) { return []byte("cert"), time.Now().Add(time.Hour), nil }

func TestTokenUsesAreExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	f, _ := openFleet(t, t.TempDir())
	tok, _, err := f.CreateToken(admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 5},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := f.Enroll(Enrollment{Token: tok, Hostname: "h", Issue: issue})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrPermission):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 5 || refused.Load() != 15 {
		t.Fatalf("%d enrolled, %d refused; want 5 and 15", ok.Load(), refused.Load())
	}
}

func TestWrongSecretRefused(t *testing.T) {
	t.Parallel()
	f, _ := openFleet(t, t.TempDir())
	tok, _, _ := f.CreateToken(admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	forged := tok
	forged.Secret = make([]byte, enroll.SecretLen)
	if _, _, err := f.Enroll(Enrollment{Token: forged, Issue: issue}); !errors.Is(err, errdefs.ErrPermission) {
		t.Fatalf("forged secret: %v", err)
	}
	// The real one still works: a forged try did not spend a use.
	if _, _, err := f.Enroll(Enrollment{Token: tok, Issue: issue}); err != nil {
		t.Fatalf("real token after a forged try: %v", err)
	}
}

func TestRevocationSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bdb, err := db.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := New(bdb, nil)
	tok, _, _ := f.CreateToken(admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	box, _, err := f.Enroll(Enrollment{Token: tok, Issue: issue})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Revoke(admin, box.ID); err != nil {
		t.Fatal(err)
	}
	if !f.IsRevoked(box.ID) {
		t.Fatal("not revoked in memory")
	}
	bdb.Close()
	f2, _ := openFleet(t, dir)
	if !f2.IsRevoked(box.ID) {
		t.Fatal("revocation lost across a restart")
	}
	if _, err := f2.Approve(admin, box.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("approving a revoked box: %v", err)
	}
}

func TestTenantsSeeOnlyTheirOwn(t *testing.T) {
	t.Parallel()
	f, _ := openFleet(t, t.TempDir())
	tok, _, _ := f.CreateToken(admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	box, _, _ := f.Enroll(Enrollment{Token: tok, Issue: issue})
	other := audit.Actor{TenantID: "bank-b", Name: "eve"}
	if _, err := f.Box(other.TenantID, box.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant reads box: %v", err)
	}
	if _, err := f.Revoke(other, box.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant revokes box: %v", err)
	}
	if bs, _ := f.Boxes(other.TenantID); len(bs) != 0 {
		t.Fatalf("other tenant lists %d boxes", len(bs))
	}
	if err := f.RevokeToken(other, tok.IDString()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant revokes token: %v", err)
	}
}

func TestLabelsValidated(t *testing.T) {
	t.Parallel()
	f, _ := openFleet(t, t.TempDir())
	tok, _, _ := f.CreateToken(admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	box, _, _ := f.Enroll(Enrollment{Token: tok, Issue: issue})
	b, err := f.Label(admin, box.ID, map[string]string{"bank": "icbc", "company": "acme"})
	if err != nil || b.Labels["bank"] != "icbc" {
		t.Fatalf("label: %+v %v", b.Labels, err)
	}
	b, err = f.Label(admin, box.ID, map[string]string{"bank": ""})
	if err != nil || len(b.Labels) != 1 {
		t.Fatalf("remove label: %+v %v", b.Labels, err)
	}
	if _, err := f.Label(admin, box.ID, map[string]string{"Bad Key": "x"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad key: %v", err)
	}
}
