package qemu

import (
	"context"
	"errors"
	"os"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Network stands for edgebox's workload bridge, which Windows hosts do
// not have: their VMs get QEMU's user-mode network.
type Network struct{}

// EgressPolicies stands for the egress policies Windows hosts cannot
// enforce: a VM whose release restricts egress does not start there.
type EgressPolicies struct{}

// EgressRefused: nothing is refused where nothing is enforced.
func (d *Driver) EgressRefused(context.Context, string) (uint64, error) { return 0, nil }

func (d *Driver) applyEgress(context.Context, instance, *edgeboxv1.Workload) error { return nil }

// HoldsNetwork: Windows VMs hold no bridge attachment.
func (d *Driver) HoldsNetwork(string) bool { return false }

func (d *Driver) haveBridge() bool { return false }

func (d *Driver) bridgeUp(context.Context, *instance, []port) (*os.File, guestNet, error) {
	return nil, guestNet{}, errors.New("qemu: no bridge on Windows")
}

func (d *Driver) bridgeDown(context.Context, string, []port) error { return nil }

func (d *Driver) sweepNetwork(context.Context) ([]string, error) { return nil, nil }
