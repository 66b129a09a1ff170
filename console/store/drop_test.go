package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestDropGone(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	batch := []*txnReq{
		{ctx: live, done: make(chan struct{})},
		{ctx: gone, done: make(chan struct{})},
		{ctx: live, done: make(chan struct{})},
	}
	dropped := batch[1]
	kept := dropGone(batch)
	if len(kept) != 2 || kept[0].ctx != live || kept[1].ctx != live {
		t.Fatalf("kept %d requests", len(kept))
	}
	select {
	case <-dropped.done:
	default:
		t.Fatal("a dropped request was not answered")
	}
	if !errors.Is(dropped.err, context.Canceled) {
		t.Fatalf("a dropped request's error: %v", dropped.err)
	}
}

// TestTxnOfAGoneCallerIsWrittenOrSaysNot floods the committer with
// transactions whose callers give up at random times: each key is on disk
// exactly when its Txn said it was written.
func TestTxnOfAGoneCallerIsWrittenOrSaysNot(t *testing.T) {
	s := openTestBolt(t, linger)
	const n = 3000
	written := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%50)*100*time.Microsecond)
			defer cancel()
			_, err := s.Txn(ctx, Txn{Then: []Op{{Key: fmt.Sprint("k/", i), Value: []byte("v")}}})
			written[i] = err == nil
		}()
	}
	wg.Wait()
	dropped := 0
	for i := range n {
		_, err := s.Get(context.Background(), fmt.Sprint("k/", i))
		switch {
		case written[i] && err != nil:
			t.Fatalf("key %d: Txn said written, Get: %v", i, err)
		case !written[i] && err == nil:
			t.Fatalf("key %d: Txn said not written, but it is", i)
		case !written[i]:
			dropped++
		}
	}
	t.Logf("%d of %d transactions dropped unwritten", dropped, n)
}
