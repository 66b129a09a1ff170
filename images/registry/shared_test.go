package registry

import (
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
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
		loc, err := url.Parse(startUpload(t, c, bases[i].String(), "robots/shared"))
		if err != nil {
			t.Fatal(err)
		}
		loc.Scheme, loc.Host = bases[next].Scheme, bases[next].Host
		finishUpload(t, c, loc, blob, fmt.Sprintf("an upload started on registry %d, ended on registry %d", i, next))
		readBlob(t, c, bases[i].String(), "robots/shared", blob, fmt.Sprintf("the blob read through registry %d", i))
	}
}
