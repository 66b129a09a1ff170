package auth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
)

// Role is what a user may do in one tenant.
type Role string

// The roles, from least to most. A user holds at most one in each tenant.
const (
	// Viewer reads the fleet, apps and keys.
	Viewer Role = "viewer"
	// Auditor reads what a viewer reads, and the audit log.
	Auditor Role = "auditor"
	// Operator is a viewer who deploys, labels, approves boxes and leases
	// keys.
	Operator Role = "operator"
	// Maintainer is an operator who opens remote sessions on boxes.
	Maintainer Role = "maintainer"
	// Admin may do everything in its tenant: users, API and enrollment
	// tokens, revoking boxes. An admin of the default tenant also manages
	// tenants.
	Admin Role = "admin"
)

// Roles lists every role.
var Roles = []Role{Viewer, Auditor, Operator, Maintainer, Admin}

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	if slices.Contains(Roles, Role(s)) {
		return Role(s), nil
	}
	return "", errdefs.Invalid("no role %q: use viewer, auditor, operator, maintainer or admin", s)
}

// Permission is a kind of API call.
type Permission int

const (
	// Read: fleet, apps, keys, releases, pins, workload logs.
	Read Permission = iota + 1
	// Operate: deploy and undeploy, label, approve, lease and release keys,
	// create apps and releases, push images.
	Operate
	// Maintain: remote sessions on boxes and workloads.
	Maintain
	// Administer: users, API tokens, enrollment tokens, revoking and wiping
	// boxes, the console's metrics and profiles.
	Administer
	// Audit: the audit log.
	Audit
)

func (p Permission) String() string {
	switch p {
	case Read:
		return "read"
	case Operate:
		return "operate"
	case Maintain:
		return "maintain"
	case Administer:
		return "administer"
	case Audit:
		return "audit"
	}
	return fmt.Sprintf("permission(%d)", int(p))
}

// Can reports whether r grants p.
func (r Role) Can(p Permission) bool {
	switch r {
	case Admin:
		return true
	case Maintainer:
		return p == Read || p == Operate || p == Maintain
	case Operator:
		return p == Read || p == Operate
	case Auditor:
		return p == Read || p == Audit
	case Viewer:
		return p == Read
	}
	return false
}

// ConsoleTenant is the tenant whose admins manage the console itself:
// tenants, and users across them. It is the tenant of everything made
// before tenants were managed.
const ConsoleTenant = "default"

// RepoTenant returns the tenant whose namespace holds a repository of the
// console's registry: the first segment of its name when that is a
// tenant's ID (bank1/robot is bank1's), else the console's own tenant
// (robots/statement is the console's). A tenant's operators push and
// pull only in its namespace, and its releases use images from there
// only, so its boxes pull only its images.
func RepoTenant(repo string, isTenant func(string) bool) string {
	if first, _, ok := strings.Cut(repo, "/"); ok && first != ConsoleTenant && isTenant(first) {
		return first
	}
	return ConsoleTenant
}
