//go:build !linux

package gcpace

// memTotal is not known here: the pace is raised only within GOMEMLIMIT.
func memTotal() uint64 { return 0 }
