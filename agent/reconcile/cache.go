package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sort"
	"sync"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/internal/atomicfile"
)

// imageCache remembers which images the agent pulled and which each
// workload ran, so that the images of every workload's current and
// previous release stay (a rollback needs no download) and the rest go.
// Images the agent did not pull (imported from a USB stick, say) are never
// removed.
type imageCache struct {
	path string // "" keeps the record in memory only

	mu  sync.Mutex
	rec imageRecord
}

type imageRecord struct {
	Pulled    map[string]string         `json:"pulled"`    // ref -> runtime
	Workloads map[string]workloadImages `json:"workloads"` // name -> images
}

type workloadImages struct {
	Current  string `json:"current"`
	Previous string `json:"previous,omitempty"`
}

func openImageCache(path string) (*imageCache, error) {
	c := &imageCache{path: path, rec: imageRecord{Pulled: map[string]string{}, Workloads: map[string]workloadImages{}}}
	if path == "" {
		return c, nil
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	} else if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &c.rec); err != nil {
		// A damaged record forgets what was pulled: nothing is removed
		// until images are pulled again, which is the safe side.
		return c, nil
	}
	if c.rec.Pulled == nil {
		c.rec.Pulled = map[string]string{}
	}
	if c.rec.Workloads == nil {
		c.rec.Workloads = map[string]workloadImages{}
	}
	return c, nil
}

func (c *imageCache) save() error {
	if c.path == "" {
		return nil
	}
	raw, err := json.Marshal(c.rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(c.path, raw)
}

// current is the image workload name last ran.
func (c *imageCache) current(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec.Workloads[name].Current
}

// pulled records an image the agent fetched.
func (c *imageCache) pulled(ref, rt string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec.Pulled[ref] = rt
	return c.save()
}

// use records that workload name now runs ref.
func (c *imageCache) use(name, ref string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.rec.Workloads[name]
	if w.Current == ref {
		return nil
	}
	if w.Current != "" {
		w.Previous = w.Current
	}
	w.Current = ref
	c.rec.Workloads[name] = w
	return c.save()
}

// collect removes pulled images that no desired workload needs: want maps
// each desired workload to its image.
func (c *imageCache) collect(ctx context.Context, want map[string]string, drivers map[string]runtime.Driver) (removed []string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keep := map[string]bool{}
	for name, img := range want {
		keep[img] = true
		if w, ok := c.rec.Workloads[name]; ok {
			keep[w.Current], keep[w.Previous] = true, true
		}
	}
	dirty := false
	for name := range c.rec.Workloads {
		if _, ok := want[name]; !ok {
			delete(c.rec.Workloads, name)
			dirty = true
		}
	}
	var refs []string
	for ref := range c.rec.Pulled {
		if !keep[ref] {
			refs = append(refs, ref)
		}
	}
	sort.Strings(refs)
	var errs []error
	for _, ref := range refs {
		st, ok := drivers[c.rec.Pulled[ref]].(runtime.ImageStore)
		if !ok {
			continue
		}
		if err := st.RemoveImage(ctx, ref); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(c.rec.Pulled, ref)
		removed = append(removed, ref)
	}
	if dirty || len(removed) > 0 {
		if err := c.save(); err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}
