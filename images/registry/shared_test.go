package registry

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
)

// TestRegistriesOnOneDirShareUploads: registries opened at once on one
// empty directory, as console replicas on a shared one are, sign upload
// state with one key: an upload started on one goes on and ends on the
// next, and the blob it made is read through the first.
func TestRegistriesOnOneDirShareUploads(t *testing.T) {
	t.Parallel()
	const n = 4
	dir := filepath.Join(t.TempDir(), "registry")
	regs := make([]*Registry, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			regs[i] = newTestRegistry(t, DefaultConfig(dir))
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	bases := make([]*url.URL, n)
	for i, reg := range regs {
		bases[i], _ = url.Parse(serveOperators(t, reg, func(string) bool { return true }).URL)
	}
	c := &http.Client{}
	for i := range n {
		next := (i + 1) % n
		blob := []byte("a layer started on registry " + string(rune('a'+i)) + " and ended on the next")
		d := digest.FromBytes(blob)
		loc, err := url.Parse(startUpload(t, c, bases[i].String(), "robots/shared"))
		if err != nil {
			t.Fatal(err)
		}
		loc.Scheme, loc.Host = bases[next].Scheme, bases[next].Host
		q := loc.Query()
		q.Set("digest", d.String())
		loc.RawQuery = q.Encode()
		req, _ := http.NewRequest(http.MethodPut, loc.String(), bytes.NewReader(blob))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("an upload started on registry %d, ended on registry %d: %s %s", i, next, resp.Status, body)
		}
		resp, err = c.Get(bases[i].String() + "/v2/robots/shared/blobs/" + d.String())
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Equal(got, blob) {
			t.Fatalf("the blob read through registry %d: %s %q", i, resp.Status, got)
		}
	}
}
