package qemu

import "context"

// Run waits for ctx: Windows VMs are on QEMU's user network, whose DHCP
// is QEMU's own.
func (d *Driver) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
