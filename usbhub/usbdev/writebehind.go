package usbdev

import (
	"context"
	"fmt"
	"sync"
)

// WriteBehind returns d with its OUT transfers (bulk and interrupt)
// answered at once, before d has them: for a device far away, such as a
// key on another box, where a command's OUT and the IN that reads its
// answer would otherwise cost a round trip each. The IN is then on its
// way while the OUT travels, and a smart card's command costs one round
// trip.
//
// Each endpoint's OUT transfers still reach d one at a time and in
// order: an OUT waits for the one before it on its endpoint. An OUT that
// fails is reported by the next transfer on any endpoint, which returns
// its error instead of running. Control transfers are not written
// behind: they change the device's state, and their answers matter.
func WriteBehind(d Device) Device {
	return &writeBehind{Device: d, eps: map[uint8]chan struct{}{}}
}

type writeBehind struct {
	Device

	mu     sync.Mutex
	eps    map[uint8]chan struct{} // per OUT endpoint: closed when its OUT in flight ends
	failed error                   // an OUT that failed, not reported yet
}

// Transfer runs an IN as d does; an OUT is answered as soon as the one
// before it on its endpoint has ended.
func (w *writeBehind) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	if err := w.takeFailure(); err != nil {
		return nil, err
	}
	if ep&0x80 != 0 {
		return w.Device.Transfer(ctx, ep, data, length)
	}
	w.mu.Lock()
	prev := w.eps[ep]
	done := make(chan struct{})
	w.eps[ep] = done
	w.mu.Unlock()
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			// This one never starts; the next waits for the one before.
			go func() { <-prev; close(done) }()
			return nil, ctx.Err()
		}
		if err := w.takeFailure(); err != nil {
			close(done)
			return nil, err
		}
	}
	out := append([]byte(nil), data...) // the caller may reuse data at once
	go func() {
		defer close(done)
		if _, err := w.Device.Transfer(context.WithoutCancel(ctx), ep, out, 0); err != nil {
			w.mu.Lock()
			if w.failed == nil {
				w.failed = fmt.Errorf("an earlier OUT transfer on endpoint %#x: %w", ep, err)
			}
			w.mu.Unlock()
		}
	}()
	return nil, nil
}

// Control runs a control transfer as d does, after reporting an OUT that
// failed.
func (w *writeBehind) Control(ctx context.Context, s Setup, data []byte) ([]byte, error) {
	if err := w.takeFailure(); err != nil {
		return nil, err
	}
	return w.Device.Control(ctx, s, data)
}

func (w *writeBehind) takeFailure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.failed
	w.failed = nil
	return err
}
