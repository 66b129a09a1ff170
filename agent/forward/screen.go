package forward

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// MetaWorkload names the VM whose screen a vnc stream wants.
const MetaWorkload = "workload"

// Screens finds a running VM's VNC socket (the qemu driver's Consoles).
type Screens func(workload string) (socket string, err error)

// ServeScreens answers the vnc streams ln accepts until it closes: each
// is joined to its VM's VNC socket, after the same reply a forward gets.
func ServeScreens(ctx context.Context, ln net.Listener, screens Screens, cfg Config) error {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 32
	}
	return acceptEach(ctx, ln, cfg.MaxConns, "screens", func(c net.Conn) {
		defer c.Close()
		name := ""
		if tc, ok := c.(*tunnel.Conn); ok {
			name = tc.Header().Meta[MetaWorkload]
		}
		if !edgeboxv1.ValidObjectName(name) {
			forwarding.WriteReply(c, errdefs.Invalid("workload name %q is not valid", name))
			return
		}
		sock, err := screens(name)
		if err != nil {
			forwarding.WriteReply(c, err)
			return
		}
		var d net.Dialer
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		vm, err := d.DialContext(dctx, "unix", sock)
		cancel()
		if err != nil {
			forwarding.WriteReply(c, fmt.Errorf("the screen of VM %s: %v", name, err))
			return
		}
		defer vm.Close()
		if forwarding.WriteReply(c, nil) != nil {
			return
		}
		forwarding.Join(ctx, c, vm)
	})
}
