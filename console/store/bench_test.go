package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/store"
)

// BenchmarkBoltCommit compares durable revisions per second through the
// store's group commit (64 concurrent writers) with plain single-put bbolt
// transactions (one writer, each its own fsync) on the same disk, in the
// same run, and reports the store's commit latency.
func BenchmarkBoltCommit(b *testing.B) {
	const ops = 6000
	dir := b.TempDir()
	for range b.N {
		// Baseline: one put, one transaction, one fsync.
		db, err := bolt.Open(filepath.Join(dir, fmt.Sprintf("single-%d.db", time.Now().UnixNano())), 0o600, nil)
		if err != nil {
			b.Fatal(err)
		}
		db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("kv")); return err })
		const singleOps = 1000
		start := time.Now()
		for i := range singleOps {
			err := db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket([]byte("kv")).Put([]byte(fmt.Sprintf("box/%04d/workload/w%d", i%1000, i%50)), make([]byte, 256))
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		single := float64(singleOps) / time.Since(start).Seconds()
		db.Close()

		// The store, 64 writers.
		db, err = bolt.Open(filepath.Join(dir, fmt.Sprintf("store-%d.db", time.Now().UnixNano())), 0o600, nil)
		if err != nil {
			b.Fatal(err)
		}
		s, err := store.OpenBolt(db)
		if err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, ops)
		var wg sync.WaitGroup
		const writers = 64
		start = time.Now()
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < ops; i += writers {
					t0 := time.Now()
					if _, err := store.Put(context.Background(), s, fmt.Sprintf("box/%04d/workload/w%d", i%1000, i%50), make([]byte, 256)); err != nil {
						b.Error(err)
						return
					}
					lat[i] = time.Since(t0)
				}
			}()
		}
		wg.Wait()
		group := float64(ops) / time.Since(start).Seconds()
		s.Close()
		db.Close()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(single, "single-put-rev/s")
		b.ReportMetric(group, "group-commit-rev/s")
		b.ReportMetric(group/single, "speedup")
		b.ReportMetric(float64(lat[ops/2].Microseconds())/1000, "commit-p50-ms")
		b.ReportMetric(float64(lat[ops*99/100].Microseconds())/1000, "commit-p99-ms")
	}
}
