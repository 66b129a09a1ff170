package locks

import (
	"fmt"
	"net"

	"github.com/Microsoft/go-winio"
)

// PipeName is the named pipe of the local API on Windows.
const PipeName = `\\.\pipe\edgebox-agent`

// Listen listens for the local API on the named pipe PipeName; dir is
// not used on Windows. Any local user may connect (workloads run as
// users of their own); no one may from the network.
func Listen(dir string) (net.Listener, string, error) {
	// SDDL: full access for SYSTEM and administrators, read and write for
	// interactive and service users; network logons are denied.
	ln, err := winio.ListenPipe(PipeName, &winio.PipeConfig{
		SecurityDescriptor: "D:P(D;;GA;;;NU)(A;;GA;;;SY)(A;;GA;;;BA)(A;;GRGW;;;IU)(A;;GRGW;;;SU)(A;;GRGW;;;AU)",
	})
	if err != nil {
		return nil, "", fmt.Errorf("local API: %w", err)
	}
	return ln, Address(dir), nil
}

// Address is the local API's address: its named pipe.
func Address(string) string { return "npipe://" + PipeName }
