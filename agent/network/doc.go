// Package network gives edgebox's container workloads a network: a bridge
// of edgebox's own (edgebox0 by default) with NAT for outbound traffic,
// addresses from a subnet of the box's choosing, published ports and a
// resolv.conf from the box's real resolvers.
//
// It drives the standard CNI plugins (bridge, host-local, portmap, firewall
// and loopback, Debian's containernetworking-plugins in /usr/lib/cni)
// through containerd's go-cni library. A workload is attached inside a
// network namespace the caller made (see CreateNetns); Attach returns its
// address, Detach gives everything back, and Sweep, run when the agent
// starts, removes what workloads that no longer exist left behind when the
// agent or the box was killed.
//
// What lives where:
//
//	<StateDir>/edgebox.conflist      the CNI network configuration, rewritten by New
//	<StateDir>/ipam/<Name>/<ip>      host-local's leases, one file per address
//	/var/lib/cni/results/<Name>-<id>-eth0   libcni's cache of each attachment
//	                                 (go-cni has no option to move it)
//	<NetnsDir>/<id>                  a workload's network namespace
//
// Attach, Detach and the netns helpers are safe for concurrent use with
// different ids. Sweep must run alone, before workloads are attached.
package network
