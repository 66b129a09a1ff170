package qemu

import (
	"context"
	"errors"
	"os"
)

// Network stands for edgebox's workload bridge, which Windows hosts do
// not have: their VMs get QEMU's user-mode network.
type Network struct{}

// HoldsNetwork: Windows VMs hold no bridge attachment.
func (d *Driver) HoldsNetwork(string) bool { return false }

func (d *Driver) haveBridge() bool { return false }

func (d *Driver) bridgeUp(context.Context, *instance, []port) (*os.File, guestNet, error) {
	return nil, guestNet{}, errors.New("qemu: no bridge on Windows")
}

func (d *Driver) bridgeDown(context.Context, string, []port) error { return nil }

func (d *Driver) sweepNetwork(context.Context) ([]string, error) { return nil, nil }
