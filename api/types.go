// Package api is the console's HTTP API as Go types and a client. The CLI
// and tests use it; the console serves the same types.
package api

import (
	"encoding/json"
	"time"
)

// Error is the body of every failed call.
type Error struct {
	Error string `json:"error"`
}

// Box is a box as the API shows it.
type Box struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	TenantID string            `json:"tenant_id"`
	Region   string            `json:"region"`
	Site     string            `json:"site"`
	Labels   map[string]string `json:"labels,omitempty"`
	State    string            `json:"state"` // pending, approved, revoked
	Online   bool              `json:"online"`
	// Health is what the console makes of the box: "online";
	// "disconnected-running" (no tunnel, but a strict majority of its
	// site hears it: its line is down); "down" (a strict majority does
	// not); "unknown" (too few of its site voted, or the whole site is out
	// of sight). HealthDetail gives the grounds.
	Health       string `json:"health,omitempty"`
	HealthDetail string `json:"health_detail,omitempty"`
	// RanUntil is the latest time its site's votes show the box running:
	// its own, or a peer's that heard it. Votes kept while a site was out
	// of sight carry it past the outage's start once the line is back.
	RanUntil  *time.Time `json:"ran_until,omitempty"`
	RTTMillis float64    `json:"rtt_ms,omitempty"`
	// Address is where the box's tunnel comes from, as the console sees
	// it (its office's public address, behind NAT), while it is online.
	Address     string     `json:"address,omitempty"`
	ConnectedAt *time.Time `json:"connected_at,omitempty"`
	// Replica is the console replica that holds the box's tunnel, when
	// the console runs as several (docs/ha.md).
	Replica      string     `json:"replica,omitempty"`
	LastSeen     *time.Time `json:"last_seen,omitempty"`
	Hostname     string     `json:"hostname,omitempty"`
	OS           string     `json:"os,omitempty"`
	Arch         string     `json:"arch,omitempty"`
	OSVersion    string     `json:"os_version,omitempty"`
	AgentVersion string     `json:"agent_version,omitempty"`
	Capability   uint32     `json:"capability_version,omitempty"`
	CPUs         uint32     `json:"cpus,omitempty"`
	MemoryBytes  uint64     `json:"memory_bytes,omitempty"`
	EnrolledAt   time.Time  `json:"enrolled_at"`
	CertNotAfter time.Time  `json:"cert_not_after"`
	// Wipe is set for a box revoked with a wipe.
	Wipe *BoxWipe `json:"wipe,omitempty"`
	// Vitals are the box's latest figures of itself, reported each
	// minute; absent until its first report to this console.
	Vitals *BoxVitals `json:"vitals,omitempty"`
}

// BoxVitals are a box's own figures at one moment (its latest report). A
// figure its operating system does not tell is 0.
type BoxVitals struct {
	CPUPercent         float64   `json:"cpu_percent"`
	MemoryUsedBytes    uint64    `json:"memory_used_bytes"`
	MemoryTotalBytes   uint64    `json:"memory_total_bytes"`
	DiskUsedBytes      uint64    `json:"disk_used_bytes"`
	DiskTotalBytes     uint64    `json:"disk_total_bytes"`
	TemperatureCelsius float64   `json:"temperature_celsius,omitempty"`
	UptimeSeconds      uint64    `json:"uptime_seconds"`
	ReportedAt         time.Time `json:"reported_at"`
}

// RevokeRequest is the optional body of POST /api/v1/boxes/{id}/revoke.
type RevokeRequest struct {
	// Wipe: before its session is dropped, the box is told to stop and
	// remove its workloads, give back the USB keys they held, and erase
	// its desired state and its identity. The box is revoked at once
	// whatever it answers; its record says whether it confirmed.
	Wipe bool `json:"wipe,omitempty"`
	// WipeTimeout is how long to wait for the box's answer: a Go duration
	// from "1s" to "10m"; default "30s".
	WipeTimeout string `json:"wipe_timeout,omitempty"`
}

// BoxWipe is what became of a box's wipe.
type BoxWipe struct {
	AskedAt time.Time `json:"asked_at"`
	AskedBy string    `json:"asked_by"`
	// Confirmed: the box answered that everything is erased.
	Confirmed bool `json:"confirmed"`
	// Result is "wiped", "asked" (no answer yet), or "not confirmed: …"
	// with the reason: "box offline", "timed out after 30s", what the box
	// could not do.
	Result           string     `json:"result"`
	AnsweredAt       *time.Time `json:"answered_at,omitempty"`
	WorkloadsRemoved []string   `json:"workloads_removed,omitempty"`
	KeysReleased     []string   `json:"keys_released,omitempty"`
	Problems         []string   `json:"problems,omitempty"`
}

// BoxList is the answer to GET /api/v1/boxes.
type BoxList struct {
	Boxes []Box `json:"boxes"`
}

// LabelRequest sets labels; an empty value removes the label.
type LabelRequest struct {
	Labels map[string]string `json:"labels"`
}

// TokenRequest asks for an enrollment token.
type TokenRequest struct {
	Region          string            `json:"region"`
	Site            string            `json:"site"`
	Labels          map[string]string `json:"labels,omitempty"`
	TTL             string            `json:"ttl,omitempty"`  // Go duration, default "24h"
	Uses            int               `json:"uses,omitempty"` // default 1
	RequireApproval bool              `json:"require_approval,omitempty"`
}

// Token describes an enrollment token (never its secret).
type Token struct {
	ID              string            `json:"id"`
	Region          string            `json:"region"`
	Site            string            `json:"site"`
	Labels          map[string]string `json:"labels,omitempty"`
	RequireApproval bool              `json:"require_approval"`
	Uses            int               `json:"uses"`
	Used            int               `json:"used"`
	ExpiresAt       time.Time         `json:"expires_at"`
	CreatedAt       time.Time         `json:"created_at"`
	CreatedBy       string            `json:"created_by"`
	Revoked         bool              `json:"revoked"`
}

// CreatedToken is the answer to creating a token: the only time its text is
// shown.
type CreatedToken struct {
	Token
	Text string `json:"token"`
	// EnrollCommand is the command to run on a box that has the agent.
	EnrollCommand string `json:"enroll_command"`
	// InstallLinux and InstallWindows are the lines to paste on a fresh
	// box (a root shell; an elevated PowerShell): they download the agent
	// from the console over pinned TLS, verify it and install it.
	InstallLinux   string `json:"install_linux"`
	InstallWindows string `json:"install_windows"`
}

// TokenList is the answer to GET /api/v1/tokens.
type TokenList struct {
	Tokens []Token `json:"tokens"`
}

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Target string    `json:"target,omitempty"`
	Remote string    `json:"remote,omitempty"`
	Result string    `json:"result"`
	Detail string    `json:"detail,omitempty"`
}

// AuditList is the answer to GET /api/v1/audit.
type AuditList struct {
	Entries []AuditEntry `json:"entries"`
}

// DesiredObject is one object of a box's desired state. Spec is the
// object's spec in protobuf's JSON form (a Workload, UsbAssignment, …).
type DesiredObject struct {
	Kind     string          `json:"kind"`
	Name     string          `json:"name"`
	Revision uint64          `json:"revision"`
	Spec     json.RawMessage `json:"spec"`
}

// ObjectStatus is what the box last reported of one desired object.
type ObjectStatus struct {
	Kind             string    `json:"kind"`
	Name             string    `json:"name"`
	ObservedRevision uint64    `json:"observed_revision"`
	Phase            string    `json:"phase"`
	Message          string    `json:"message,omitempty"`
	UpdatedAt        time.Time `json:"updated_at"`
	// Release is, for a Workload, the release running now.
	Release string `json:"release,omitempty"`
	// Health is, for a Workload with probes, "healthy" or "unhealthy".
	Health string `json:"health,omitempty"`
	// Address is a Workload's IPv4 address on the box's bridge, if it
	// has one.
	Address string `json:"address,omitempty"`
	// Ports are a Workload's ports published on the box, each as
	// "host_port:port/protocol".
	Ports []string `json:"ports,omitempty"`
	// EgressRefused counts the connections a Workload's egress policy
	// refused.
	EgressRefused uint64 `json:"egress_refused,omitempty"`
	// Restarts counts a Workload's restarts after it exited, since the
	// box's agent started or it last ran steadily.
	Restarts uint32 `json:"restarts,omitempty"`
}

// Event is one thing that happened to a desired object on a box.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Name    string    `json:"name"`
	Reason  string    `json:"reason"`
	Message string    `json:"message,omitempty"`
	Warning bool      `json:"warning,omitempty"`
}

// BoxState is a box's desired state, how far the box has stored it, and
// what the box reports of it.
type BoxState struct {
	BoxID string `json:"box_id"`
	// Revision is the box's current desired revision, Acked the last one
	// the box stored.
	Revision uint64          `json:"revision"`
	Acked    uint64          `json:"acked"`
	Objects  []DesiredObject `json:"objects"`
	Statuses []ObjectStatus  `json:"statuses"`
	Events   []Event         `json:"events"`
}

// Revision is the box revision a change of desired state was given.
type Revision struct {
	Revision uint64 `json:"revision"`
}

// App is a robot or service operators deploy.
type App struct {
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	CreatedBy   string    `json:"created_by"`
}

// AppList is the answer to GET /api/v1/apps.
type AppList struct {
	Apps []App `json:"apps"`
}

// ReleaseSpec is what an operator gives to create a release. For the
// containerd and qemu runtimes Image is a reference in the console's
// registry, by tag or digest; for process it is the program's path.
type ReleaseSpec struct {
	Version     string   `json:"version"`
	Runtime     string   `json:"runtime"`
	Image       string   `json:"image"`
	Env         []string `json:"env,omitempty"`
	Args        []string `json:"args,omitempty"`
	CPUMillis   int64    `json:"cpu_millis,omitempty"`
	MemoryBytes int64    `json:"memory_bytes,omitempty"`
	Restart     string   `json:"restart,omitempty"`
	// KeepState, for VMs: the disk overlay survives restarts.
	KeepState bool `json:"keep_state,omitempty"`
	// Probes say whether the app is healthy; rollouts gate on them.
	Probes []Probe `json:"probes,omitempty"`
	// Ports the app serves, for remote access to it.
	Ports []Port `json:"ports,omitempty"`
	// Keys are the UKEYs the app needs, each by the labels a key must
	// carry (bank=ICBC).
	Keys []KeyNeed `json:"keys,omitempty"`
	// Volumes are box-local directories the app keeps across releases.
	Volumes []Volume `json:"volumes,omitempty"`
	// Network is how a container or VM reaches the network: "" or
	// "bridge" (edgebox's bridge on the box, with NAT; the default),
	// "host" (the box's own network; containerd only), "user" (QEMU's
	// user-mode network; qemu only) or "none" (loopback only). A process
	// always uses the box's network.
	Network string `json:"network,omitempty"`
	// Egress limits where the workload may connect: DNS names (followed
	// as their addresses change), IPv4 addresses and IPv4 CIDR prefixes,
	// at most 256. Empty, or the single word "any", allows everything.
	// It is enforced on the bridge network only.
	Egress []string `json:"egress,omitempty"`
	// ProxyEnv passes the box's proxy to the workload as HTTPS_PROXY and
	// HTTP_PROXY.
	ProxyEnv bool `json:"proxy_env,omitempty"`
	// KeysHoldUpdates: while a process on the box has one of the app's
	// leased UKEYs open, the box is not updated; a key is not cut mid-use.
	KeysHoldUpdates bool `json:"keys_hold_updates,omitempty"`
}

// Volume is a box-local directory a container sees at Path.
type Volume struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Port is a port an app serves. With HostPort it is published on the
// box: HostPort on the box reaches Port in the workload (bridge and user
// networks).
type Port struct {
	Name     string `json:"name,omitempty"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol,omitempty"` // tcp (default) or udp
	// HostPort is the box's port, 1 to 65535; 0 publishes nothing.
	HostPort int `json:"host_port,omitempty"`
	// HostIP, with HostPort, publishes on that IPv4 address of the box
	// only; empty: on all of them.
	HostIP string `json:"host_ip,omitempty"`
}

// KeyNeed is one UKEY an app needs: any key whose labels include these.
type KeyNeed struct {
	Labels map[string]string `json:"labels"`
}

// Probe is one health check: exactly one of Exec (a command inside the
// workload), HTTP (a URL the box reaches) and TCP (a host:port).
type Probe struct {
	Exec             []string `json:"exec,omitempty"`
	HTTP             string   `json:"http,omitempty"`
	TCP              string   `json:"tcp,omitempty"`
	PeriodSeconds    uint32   `json:"period_seconds,omitempty"`
	TimeoutSeconds   uint32   `json:"timeout_seconds,omitempty"`
	FailureThreshold uint32   `json:"failure_threshold,omitempty"`
	InitialDelay     uint32   `json:"initial_delay_seconds,omitempty"`
}

// Release is one immutable version of an app; Image is by digest.
type Release struct {
	App string `json:"app"`
	ReleaseSpec
	Tag       string    `json:"tag,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
}

// ReleaseList is the answer to GET /api/v1/apps/:app/releases.
type ReleaseList struct {
	Releases []Release `json:"releases"`
}

// Pin says which release of an app runs on a region, site or box.
type Pin struct {
	App     string    `json:"app"`
	Scope   string    `json:"scope"`
	Target  string    `json:"target"`
	Version string    `json:"version"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
}

// PinList is the answer to GET /api/v1/apps/:app/pins.
type PinList struct {
	Pins []Pin `json:"pins"`
}

// DeployRequest pins an app's release on a scope.
type DeployRequest struct {
	Version string `json:"version"`
}

// DeployResult says which boxes' desired state changed.
type DeployResult struct {
	Pin     *Pin     `json:"pin,omitempty"`
	Changed []string `json:"changed_boxes"`
	// Problems say what could not be done now, box by box, such as no
	// free key for a release that needs one.
	Problems []string `json:"problems,omitempty"`
}

// AppBoxStatus is one box's side of an app.
type AppBoxStatus struct {
	BoxID          string    `json:"box_id"`
	BoxName        string    `json:"box_name"`
	Online         bool      `json:"online"`
	DesiredRelease string    `json:"desired_release"`
	RunningRelease string    `json:"running_release,omitempty"`
	Phase          string    `json:"phase,omitempty"`
	Health         string    `json:"health,omitempty"`
	Message        string    `json:"message,omitempty"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
	// Address, Ports and EgressRefused are the workload's network as the
	// box reports it (see ObjectStatus).
	Address       string   `json:"address,omitempty"`
	Ports         []string `json:"ports,omitempty"`
	EgressRefused uint64   `json:"egress_refused,omitempty"`
	Restarts      uint32   `json:"restarts,omitempty"`
}

// AppStatus is the answer to GET /api/v1/apps/:app/status: every box that
// should run the app or still reports it.
type AppStatus struct {
	App   string         `json:"app"`
	Boxes []AppBoxStatus `json:"boxes"`
}

// Logs is the end of a workload's output on a box.
type Logs struct {
	Text      string `json:"text"`
	Truncated bool   `json:"truncated,omitempty"`
}

// Key is one UKEY on one box.
type Key struct {
	ID           string            `json:"id"`
	BoxID        string            `json:"box_id"`
	Port         string            `json:"port"`
	VendorID     string            `json:"vendor_id"`
	ProductID    string            `json:"product_id"`
	Serial       string            `json:"serial,omitempty"`
	Manufacturer string            `json:"manufacturer,omitempty"`
	Product      string            `json:"product,omitempty"`
	Class        string            `json:"class"`
	Switchable   bool              `json:"switchable"`
	State        string            `json:"state"` // present, absent, stuck
	Broken       bool              `json:"broken,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Holder       string            `json:"holder,omitempty"`
	// HolderBox is the holder's box when it is not the key's own: the
	// key is used from there.
	HolderBox  string    `json:"holder_box,omitempty"`
	LeasedAt   time.Time `json:"leased_at,omitzero"`
	LeasedBy   string    `json:"leased_by,omitempty"`
	LastChange time.Time `json:"last_change"`
}

// KeyList is the answer to GET /api/v1/keys.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// LeaseRequest leases a key to a workload on its box, or on Box: a key
// used from another box travels through the two boxes' tunnels.
type LeaseRequest struct {
	Workload string `json:"workload"`
	Box      string `json:"box,omitempty"` // ID or name; the key's own box when empty
}

// KeyEvent is one line of a key's history.
type KeyEvent struct {
	Time     time.Time `json:"time"`
	Event    string    `json:"event"`
	Workload string    `json:"workload,omitempty"`
	Actor    string    `json:"actor,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

// KeyHistory is the answer to GET /api/v1/keys/:key/history.
type KeyHistory struct {
	Key    string     `json:"key"`
	Events []KeyEvent `json:"events"`
}

// LoginRequest logs a user in: POST /api/v1/login. With TokenName set, the
// answer is a new API token for the user (what 'edgebox login --user'
// keeps); without, a browser session cookie.
type LoginRequest struct {
	User      string `json:"user"`
	Password  string `json:"password"`
	TokenName string `json:"token_name,omitempty"`
	// TokenTTL is a Go duration ("720h"); empty: the token never expires.
	TokenTTL string `json:"token_ttl,omitempty"`
}

// Me is who the caller is: GET /api/v1/me, and the answer to a login.
type Me struct {
	User string `json:"user"`
	// Roles is the caller's role in each tenant it holds one in.
	Roles map[string]string `json:"roles"`
	// Tenant is the tenant this call acted in, and Role the caller's there.
	Tenant string `json:"tenant"`
	Role   string `json:"role"`
	// CSRF is what a browser session sends in X-CSRF-Token with every
	// change; empty for API tokens.
	CSRF      string    `json:"csrf,omitempty"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Token is a new API token, only in the answer to a login that asked
	// for one.
	Token string `json:"token,omitempty"`
}

// User is a user as an admin sees it.
type User struct {
	Name      string            `json:"name"`
	Roles     map[string]string `json:"roles"`
	CreatedAt time.Time         `json:"created_at"`
}

// UserRequest creates a user with a role in the caller's tenant.
type UserRequest struct {
	Name     string `json:"name"`
	Password string `json:"password"`
	Role     string `json:"role"`
}

// RoleRequest sets a user's role in the caller's tenant; "" takes it away.
type RoleRequest struct {
	Role string `json:"role"`
}

// PasswordRequest changes a password. Old is required when users change
// their own.
type PasswordRequest struct {
	Old      string `json:"old,omitempty"`
	Password string `json:"password"`
}

// APITokenRequest makes an API token for the caller.
type APITokenRequest struct {
	Name string `json:"name"`
	TTL  string `json:"ttl,omitempty"` // Go duration; empty: never expires
}

// APIToken describes an API token (never its secret).
type APIToken struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	User      string    `json:"user"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Token is the token's text, only in the answer that made it.
	Token string `json:"token,omitempty"`
}

// Tenant is a customer of the console.
type Tenant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// DeployPreview is what a deploy would do: GET
// /api/v1/apps/{app}/pins/{scope}/{target}/preview?version=V.
type DeployPreview struct {
	// Boxes are the boxes that would run the release; Already of them
	// have it now; Offline are not connected.
	Boxes   []PreviewBox `json:"boxes"`
	Already int          `json:"already"`
	Offline int          `json:"offline"`
	// NoKey counts boxes where a key the release needs has no free match.
	NoKey int `json:"no_key"`
	// Kept counts boxes of the scope where a narrower pin wins.
	Kept int `json:"kept"`
}

// PreviewBox is one box a deploy would reach.
type PreviewBox struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Online      bool     `json:"online"`
	MissingKeys []string `json:"missing_keys,omitempty"`
}

// RolloutRequest asks for a rollout of App from one release to another
// (POST /api/v1/rollouts). Exactly one of Regions, Site, Selector and
// Boxes names what it moves.
type RolloutRequest struct {
	App      string            `json:"app"`
	From     string            `json:"from"`
	To       string            `json:"to"`
	Regions  []string          `json:"regions,omitempty"` // in order
	Site     string            `json:"site,omitempty"`
	Selector map[string]string `json:"selector,omitempty"`
	Boxes    []string          `json:"boxes,omitempty"`
	// Waves are each group's cumulative sizes: "1", "10%", "50%", "100%"
	// when empty.
	Waves []string `json:"waves,omitempty"`
	// Gate and BoxTimeout are durations such as "5m"; "" takes the
	// default (5 min and 15 min), "0s" is a gate of no time.
	Gate           string   `json:"gate,omitempty"`
	BoxTimeout     string   `json:"box_timeout,omitempty"`
	MaxUnavailable int      `json:"max_unavailable,omitempty"` // per site; 1 when 0
	FailurePercent *float64 `json:"failure_percent,omitempty"` // 10 when unset
	// RevertAll: when the rollout stops, every box it moved goes back,
	// not only those that failed.
	RevertAll bool `json:"revert_all,omitempty"`
}

// Rollout is a rollout as the API shows it. Groups are left out of
// lists.
type Rollout struct {
	ID        string            `json:"id"`
	App       string            `json:"app"`
	From      string            `json:"from"`
	To        string            `json:"to"`
	Scope     string            `json:"scope"`
	State     string            `json:"state"` // awaiting-approval, running, paused, stopped, aborted, done
	Reason    string            `json:"reason,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	CreatedBy string            `json:"created_by"`
	UpdatedAt time.Time         `json:"updated_at"`
	Approvals []RolloutApproval `json:"approvals,omitempty"`
	Settings  RolloutSettings   `json:"settings"`
	Progress  RolloutProgress   `json:"progress"`
	// Prefetch is the pre-pull of To's image (releases with an image to
	// pull): how many boxes were asked, have it on disk, failed to.
	Prefetch *RolloutPrefetch `json:"prefetch,omitempty"`
	// Group is the index of the group in progress, len(Groups) when over.
	Group   int              `json:"group"`
	Groups  []RolloutGroup   `json:"groups,omitempty"`
	Skipped []RolloutSkipped `json:"skipped,omitempty"`
}

// RolloutSettings are the rules a rollout moves by.
type RolloutSettings struct {
	Waves          []string `json:"waves"`
	Gate           string   `json:"gate"`
	BoxTimeout     string   `json:"box_timeout"`
	MaxUnavailable int      `json:"max_unavailable"`
	FailurePercent float64  `json:"failure_percent"`
	RevertAll      bool     `json:"revert_all,omitempty"`
}

// RolloutProgress counts a rollout's boxes by phase.
type RolloutProgress struct {
	Total    int `json:"total"`
	Waiting  int `json:"waiting"`
	Held     int `json:"held"`
	Updating int `json:"updating"`
	Gating   int `json:"gating"`
	Done     int `json:"done"`
	Failed   int `json:"failed"`
	Reverted int `json:"reverted"`
}

// RolloutPrefetch is how far a rollout's pre-pull got.
type RolloutPrefetch struct {
	Image  string `json:"image"`
	Asked  int    `json:"asked"`
	OnDisk int    `json:"on_disk"`
	Failed int    `json:"failed"`
}

// RolloutApproval is one user's approval.
type RolloutApproval struct {
	By    string    `json:"by"`
	At    time.Time `json:"at"`
	Stage string    `json:"stage"` // start, first-wave
}

// RolloutGroup is a region, a site or the selected boxes of a rollout,
// its boxes in wave order.
type RolloutGroup struct {
	Name  string       `json:"name"`
	Wave  int          `json:"wave"`  // the wave in progress, from 0
	Waves int          `json:"waves"` // how many
	Boxes []RolloutBox `json:"boxes"`
}

// RolloutBox is one box of a rollout.
type RolloutBox struct {
	ID       string    `json:"id"`
	Site     string    `json:"site"`
	Wave     int       `json:"wave"`
	Phase    string    `json:"phase"` // waiting, held, updating, gating, done, failed
	Reason   string    `json:"reason,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	Reverted bool      `json:"reverted,omitempty"`
}

// RolloutSkipped is a box of the scope a rollout leaves alone, and why.
type RolloutSkipped struct {
	Box    string `json:"box"`
	Reason string `json:"reason"`
}

// RolloutList is the answer to GET /api/v1/rollouts.
type RolloutList struct {
	Rollouts []Rollout `json:"rollouts"`
}

// RolloutAction is the body of a rollout's pause or abort.
type RolloutAction struct {
	Reason string `json:"reason,omitempty"` // pause
	Revert bool   `json:"revert,omitempty"` // abort: send moved boxes back
}

// RolloutRules are a tenant's rules for rollouts (GET and PUT
// /api/v1/rollout-rules): approvals, and maintenance policies by region
// and by site, each in its own time zone, with the tenant's holidays.
type RolloutRules struct {
	ApproveStart     bool                    `json:"approve_start,omitempty"`
	ApproveFirstWave bool                    `json:"approve_first_wave,omitempty"`
	Regions          map[string]UpdatePolicy `json:"regions,omitempty"`
	Sites            map[string]UpdatePolicy `json:"sites,omitempty"`
	Calendar         Calendar                `json:"calendar,omitzero"`
	UpdatedAt        time.Time               `json:"updated_at,omitzero"`
	UpdatedBy        string                  `json:"updated_by,omitempty"`
}

// UpdatePolicy says when boxes may be updated: never inside a Deny
// window and, when Allow windows are given, only inside one. Times are
// in Zone, an IANA name such as "Asia/Shanghai".
type UpdatePolicy struct {
	Zone     string         `json:"zone"`
	Allow    []UpdateWindow `json:"allow,omitempty"`
	Deny     []UpdateWindow `json:"deny,omitempty"`
	Calendar Calendar       `json:"calendar,omitzero"`
}

// UpdateWindow is a daily span, "15:00" to "17:30", on every-day,
// workdays or holidays; one whose To is before its From runs past
// midnight.
type UpdateWindow struct {
	Days string `json:"days"`
	From string `json:"from"`
	To   string `json:"to"`
}

// Calendar is a tenant's holidays and the weekend days it works, as
// dates ("2026-10-01").
type Calendar struct {
	Holidays      []string `json:"holidays,omitempty"`
	ExtraWorkdays []string `json:"extra_workdays,omitempty"`
}

// AgentRelease is one version of the agent, with a binary per platform
// ("linux/amd64"), each signed with the console's CA.
type AgentRelease struct {
	Version   string                        `json:"version"`
	Binaries  map[string]AgentReleaseBinary `json:"binaries"`
	Probation string                        `json:"probation"`
	CreatedAt time.Time                     `json:"created_at"`
	CreatedBy string                        `json:"created_by"`
}

// AgentReleaseBinary is one platform's binary of an agent release.
type AgentReleaseBinary struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// AgentReleaseList is the answer to GET /api/v1/agent-releases.
type AgentReleaseList struct {
	Releases []AgentRelease `json:"releases"`
}

// AgentPin says which agent version the boxes of a region, site or box
// run (PUT /api/v1/agent-pins/{scope}/{target} with {"version": ...}).
type AgentPin struct {
	Scope   string    `json:"scope"`
	Target  string    `json:"target"`
	Version string    `json:"version"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
}

// AgentPinList is the answer to GET /api/v1/agent-pins.
type AgentPinList struct {
	Pins []AgentPin `json:"pins"`
}
