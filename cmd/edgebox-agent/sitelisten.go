package main

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/edgebox/edgebox/agent/sitepeer"
)

// siteListen reads --site-listen: "off" (or empty) for none, "auto" for
// the box's private LAN addresses on the default port, or a list of
// IP:port.
func siteListen(flag string) ([]string, error) {
	switch flag {
	case "", "off":
		return nil, nil
	case "auto":
		addrs, err := sitepeer.LANAddrs(sitepeer.DefaultPort)
		if err != nil {
			return nil, fmt.Errorf("--site-listen auto: %w", err)
		}
		return addrs, nil
	}
	var out []string
	for _, a := range strings.Split(flag, ",") {
		ap, err := netip.ParseAddrPort(strings.TrimSpace(a))
		if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() {
			return nil, fmt.Errorf("--site-listen %q: want \"auto\", \"off\" or addresses such as 192.168.1.20:7946, each an IP of this box and a port", a)
		}
		out = append(out, ap.String())
	}
	return out, nil
}
