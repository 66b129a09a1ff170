//go:build linux && (race || deadlocks)

package network

import (
	"sync"

	"github.com/sasha-s/go-deadlock"
)

var lockCheckOff sync.Once

// quietLockChecker turns off go-deadlock, which go-cni uses for its
// mutex in race-detector builds. With this Go, go-deadlock's goroutine
// ids (petermattis/goid) are 0 for every goroutine, so two workloads
// attached at once look like one goroutine taking locks out of order,
// and it ends the process. The race detector still checks go-cni.
func quietLockChecker() { lockCheckOff.Do(func() { deadlock.Opts.Disable = true }) }
