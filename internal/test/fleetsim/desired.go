package fleetsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/edgebox/edgebox/api"
)

// PutWorkloads gives each box one workload of app, for the fake driver,
// eight boxes at a time, and returns the revision each box must store.
func PutWorkloads(admin *api.Client, ids []string, app string) ([]uint64, error) {
	revs := make([]uint64, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	spec, err := json.Marshal(map[string]string{"app": app, "release": "1", "runtime": "containerd"})
	if err != nil {
		return nil, err
	}
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			revs[i], errs[i] = admin.PutDesired(ctx, id, "Workload", "w", spec)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("box %s: %w", id, errs[i])
			}
		}()
	}
	wg.Wait()
	return revs, errors.Join(errs...)
}
