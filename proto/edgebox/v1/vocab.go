package edgeboxv1

// The words both sides of the Sync stream use, defined here once. The
// wire carries them as strings (DesiredObject.kind, ObjectStatus.phase
// and .health, Event.kind and .reason, Workload.runtime and .restart);
// agent and console use these constants, never literals of their own
// (vocab_test.go checks).
// Like the messages, they are a contract: add words, never change one's
// spelling or meaning, since boxes of several versions share a fleet.
// This file is written by hand; protoc does not touch it.

// Kinds of desired object, each naming the spec it carries
// (DesiredObject.kind, ObjectStatus.kind, Event.kind).
const (
	KindWorkload      = "Workload"
	KindUsbAssignment = "UsbAssignment"
	KindAgentConfig   = "AgentConfig"
	KindAgentRelease  = "AgentRelease"
	KindImagePrefetch = "ImagePrefetch"
	KindSitePeers     = "SitePeers"
)

// KindUpdateLock is the ObjectStatus.kind of an update lock a workload
// holds on the box (the agent's local API): while one is held, the box
// is not updated. Locks are not desired objects; the name is the holder.
const KindUpdateLock = "UpdateLock"

// KindKey is the Event.kind of an event about a USB key; Event.name is
// then the key's ID. Keys are not desired objects: they have no status.
const KindKey = "Key"

// KindOf returns the kind named by an object's spec, or "" when it has
// none (a tombstone, or a spec this version does not know).
func KindOf(o *DesiredObject) string {
	switch o.GetSpec().(type) {
	case *DesiredObject_Workload:
		return KindWorkload
	case *DesiredObject_UsbAssignment:
		return KindUsbAssignment
	case *DesiredObject_AgentConfig:
		return KindAgentConfig
	case *DesiredObject_AgentRelease:
		return KindAgentRelease
	case *DesiredObject_ImagePrefetch:
		return KindImagePrefetch
	case *DesiredObject_SitePeers:
		return KindSitePeers
	}
	return ""
}

// Phases of an object's status (ObjectStatus.phase).
const (
	PhasePending = "Pending" // not running yet, or waiting to restart
	PhasePulling = "Pulling" // its image is being fetched
	PhaseRunning = "Running"
	PhaseStopped = "Stopped" // exited, and its restart policy keeps it down
	PhaseFailed  = "Failed"  // the box could not do what the object asks
	// PhaseRemoved: the object is gone from the box; the console forgets
	// its status.
	PhaseRemoved = "Removed"
)

// ValidPhase reports whether p is one of the phases above.
func ValidPhase(p string) bool {
	switch p {
	case PhasePending, PhasePulling, PhaseRunning, PhaseStopped, PhaseFailed, PhaseRemoved:
		return true
	}
	return false
}

// Health of a workload with probes (ObjectStatus.health); "" while not
// known yet.
const (
	Healthy   = "healthy"
	Unhealthy = "unhealthy"
)

// Runtimes a workload runs under (Workload.runtime), each served on the
// box by the driver of that name.
const (
	RuntimeContainerd = "containerd" // an OCI container
	RuntimeQEMU       = "qemu"       // a virtual machine
	RuntimeProcess    = "process"    // a native program the box already holds
)

// Restart policies of a workload (Workload.restart); "" means
// RestartAlways.
const (
	RestartAlways    = "always"
	RestartOnFailure = "on-failure" // only after a non-zero exit
	RestartNever     = "never"
)

// Reasons of events about a workload (Event.reason with KindWorkload).
const (
	ReasonPulling       = "Pulling"
	ReasonPulled        = "Pulled"
	ReasonPullFailed    = "PullFailed"
	ReasonReplacing     = "Replacing"
	ReasonReplaceFailed = "ReplaceFailed"
	ReasonCreated       = "Created"
	ReasonCreateFailed  = "CreateFailed"
	ReasonStarted       = "Started"
	ReasonStartFailed   = "StartFailed"
	ReasonRestarted     = "Restarted"
	ReasonBackOff       = "BackOff"
	ReasonUnhealthy     = "Unhealthy"
	ReasonStopFailed    = "StopFailed"
	ReasonRemoved       = "Removed"
	ReasonRemoveFailed  = "RemoveFailed"
	// ReasonOrphanStopped: the box stopped a workload it found running
	// that no desired object asks for.
	ReasonOrphanStopped = "OrphanStopped"
	// ReasonSweepFailed: looking for such orphans failed (Event.name is
	// empty).
	ReasonSweepFailed = "SweepFailed"
)

// Reasons of events about a USB key (Event.reason with KindKey).
const (
	ReasonAttached = "Attached" // given to a workload
	ReasonDetached = "Detached" // taken back from a workload
	// ReasonNotAttachable: the assignment cannot be carried out on this
	// box (a simulated key for a VM workload).
	ReasonNotAttachable    = "NotAttachable"
	ReasonPowerCycled      = "PowerCycled"      // a stuck key's port was power-cycled
	ReasonPowerCycleFailed = "PowerCycleFailed" // and that failed
	ReasonBroken           = "Broken"           // the box gave up on the key: it needs a visit
)
