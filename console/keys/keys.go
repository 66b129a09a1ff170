// Package keys is the console's registry of UKEYs: every USB key on every
// box, as the boxes report their inventories, with its labels, whether it
// is present, and which workload holds its lease. A lease is exclusive and
// becomes a UsbAssignment object in the box's desired state, so it
// survives restarts and offline periods. Every change of a key goes into
// its history: the answer to "which robot used this company's ICBC key,
// when".
//
// An operator's change of a key (Label, Lease, Release, and so the leases
// a deploy makes through EnsureLeases) writes its audit entry in the
// transaction that changes the key. What a box reports of its own keys
// (Report, BoxEvent) goes into the keys' history only.
//
// Keys in the store, per tenant:
//
//	keys/<tenant>/<key id>                -> Key (JSON)
//	keyhist/<tenant>/<key id>/<20 digits> -> Entry (JSON), the last MaxHistory
package keys

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// States of a key.
const (
	Present = "present"
	Absent  = "absent"
	Stuck   = "stuck"
)

// Key is one UKEY on one box.
type Key struct {
	ID           string `json:"id"`
	TenantID     string `json:"tenant_id"`
	BoxID        string `json:"box_id"`
	Port         string `json:"port"`
	VendorID     string `json:"vendor_id"`
	ProductID    string `json:"product_id"`
	Serial       string `json:"serial,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	Product      string `json:"product,omitempty"`
	Class        string `json:"class"`
	Switchable   bool   `json:"switchable"`
	State        string `json:"state"`
	// Broken: the box gave up power-cycling it; it needs a visit.
	Broken bool              `json:"broken,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Holder string            `json:"holder,omitempty"` // the workload with the lease
	// HolderBox is the holder's box when it is not the key's own: the
	// key is used from there, over the tunnels.
	HolderBox  string    `json:"holder_box,omitempty"`
	LeasedAt   time.Time `json:"leased_at,omitzero"`
	LeasedBy   string    `json:"leased_by,omitempty"`
	FirstSeen  time.Time `json:"first_seen"`
	LastChange time.Time `json:"last_change"`
}

// Entry is one line of a key's history.
type Entry struct {
	Time     time.Time `json:"time"`
	Event    string    `json:"event"` // plugged, unplugged, stuck, lease, release, …
	Workload string    `json:"workload,omitempty"`
	Actor    string    `json:"actor,omitempty"` // operator, or "box"
	Detail   string    `json:"detail,omitempty"`
}

// MaxHistory is how many entries a key keeps.
const MaxHistory = 1000

// Bounds on what a box reports.
const (
	MaxDevices = 64
	maxString  = 128
)

// Registry is the console's key registry.
type Registry struct {
	s       store.Store
	desired *desired.State
	now     func() time.Time
}

// New returns the registry kept in s; leases go into d.
func New(s store.Store, d *desired.State) *Registry {
	return &Registry{s: s, desired: d, now: time.Now}
}

func keyKey(tenant, id string) string     { return "keys/" + tenant + "/" + id }
func histPrefix(tenant, id string) string { return "keyhist/" + tenant + "/" + id + "/" }

// ID names a key: its box, its vendor and product, and its serial, or
// its port when it has none (identical keys without serials are told
// apart by where they sit).
func ID(box string, d *edgeboxv1.UsbDevice) string {
	where := "serial:" + d.GetSerial()
	if d.GetSerial() == "" {
		where = "port:" + d.GetPort()
	}
	sum := sha256.Sum256([]byte(box + "|" + d.GetVendorId() + ":" + d.GetProductId() + "|" + where))
	return "k-" + hex.EncodeToString(sum[:6])
}

var (
	portRE = regexp.MustCompile(`^[0-9]{1,3}-[0-9]{1,3}(\.[0-9]{1,3}){0,6}$`)
	hexRE  = regexp.MustCompile(`^[0-9a-f]{4}$`)
)

// clean bounds a descriptor string from a box: printable, at most
// maxString bytes.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if len(s) > maxString {
		s = strings.ToValidUTF8(s[:maxString], "")
	}
	return s
}

// validate checks one reported device.
func validate(d *edgeboxv1.UsbDevice) error {
	if !portRE.MatchString(d.GetPort()) {
		return errdefs.Invalid("USB port %q is not a hub port path", clean(d.GetPort()))
	}
	if !hexRE.MatchString(d.GetVendorId()) || !hexRE.MatchString(d.GetProductId()) {
		return errdefs.Invalid("USB device at %s: vendor and product must be 4 lower-case hex digits", d.GetPort())
	}
	return nil
}

// Report takes a box's whole USB inventory: new keys are added, keys back
// are present again (found by serial, or by port), keys missing are
// absent, and each change goes into the key's history. Hubs are no keys.
func (r *Registry) Report(ctx context.Context, b fleet.Box, devs []*edgeboxv1.UsbDevice) error {
	if len(devs) > MaxDevices {
		return errdefs.Invalid("a USB report holds at most %d devices", MaxDevices)
	}
	now := r.now().UTC()
	seen := map[string]*edgeboxv1.UsbDevice{}
	for _, d := range devs {
		if err := validate(d); err != nil {
			return err
		}
		if d.GetClass() == "hub" {
			continue
		}
		seen[ID(b.ID, d)] = d
	}
	have, err := r.boxKeys(ctx, b.TenantID, b.ID)
	if err != nil {
		return err
	}
	var errs []error
	for id, d := range seen {
		k, known := have[id]
		state := Present
		if d.GetStuck() {
			state = Stuck
		}
		var events []Entry
		switch {
		case !known:
			k = Key{ID: id, TenantID: b.TenantID, BoxID: b.ID, FirstSeen: now}
			events = append(events, Entry{Event: "plugged", Actor: "box", Detail: "new key at " + d.GetPort()})
		case k.State == Absent:
			events = append(events, Entry{Event: "plugged", Actor: "box", Detail: "back at " + d.GetPort(), Workload: k.Holder})
		case k.Port != d.GetPort():
			events = append(events, Entry{Event: "moved", Actor: "box", Detail: k.Port + " to " + d.GetPort(), Workload: k.Holder})
		}
		if known && k.State != Stuck && state == Stuck {
			events = append(events, Entry{Event: "stuck", Actor: "box", Detail: "stopped answering", Workload: k.Holder})
		} else if known && k.State == Stuck && state == Present {
			events = append(events, Entry{Event: "recovered", Actor: "box", Workload: k.Holder})
		}
		if state == Present {
			k.Broken = false
		}
		next := k
		next.Port, next.VendorID, next.ProductID = d.GetPort(), d.GetVendorId(), d.GetProductId()
		next.Serial, next.Manufacturer, next.Product = clean(d.GetSerial()), clean(d.GetManufacturer()), clean(d.GetProduct())
		next.Class, next.Switchable, next.State = clean(d.GetClass()), d.GetSwitchable(), state
		if len(events) == 0 && sameKey(k, next) {
			continue
		}
		next.LastChange = now
		if err := r.write(ctx, next, events, now); err != nil {
			errs = append(errs, err)
		}
	}
	for id, k := range have {
		if _, ok := seen[id]; ok || k.State == Absent {
			continue
		}
		k.State, k.LastChange = Absent, now
		if err := r.write(ctx, k, []Entry{{Event: "unplugged", Actor: "box", Detail: "gone from " + k.Port, Workload: k.Holder}}, now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func sameKey(a, b Key) bool {
	return a.Port == b.Port && a.Serial == b.Serial && a.Manufacturer == b.Manufacturer && a.Product == b.Product &&
		a.Class == b.Class && a.Switchable == b.Switchable && a.State == b.State
}

// write stores k and appends events to its history, in one transaction.
func (r *Registry) write(ctx context.Context, k Key, events []Entry, now time.Time) error {
	raw, err := json.Marshal(k)
	if err != nil {
		return err
	}
	ops := []store.Op{{Key: keyKey(k.TenantID, k.ID), Value: raw}}
	for i, e := range events {
		e.Time = now
		v, _ := json.Marshal(e)
		// Nanoseconds and position order entries within a key.
		ops = append(ops, store.Op{Key: fmt.Sprintf("%s%020d", histPrefix(k.TenantID, k.ID), now.UnixNano()+int64(i)), Value: v})
	}
	if _, err := r.s.Txn(ctx, store.Txn{Then: ops}); err != nil {
		return err
	}
	if len(events) > 0 {
		return r.trim(ctx, k.TenantID, k.ID)
	}
	return nil
}

// trim keeps the last MaxHistory entries of a key.
func (r *Registry) trim(ctx context.Context, tenant, id string) error {
	kvs, _, err := r.s.Range(ctx, histPrefix(tenant, id), 0)
	if err != nil || len(kvs) <= MaxHistory {
		return err
	}
	var ops []store.Op
	for _, kv := range kvs[:len(kvs)-MaxHistory] {
		ops = append(ops, store.Op{Key: kv.Key, Delete: true})
	}
	_, err = r.s.Txn(ctx, store.Txn{Then: ops})
	return err
}

// boxKeys returns the keys of one box, by ID.
func (r *Registry) boxKeys(ctx context.Context, tenant, box string) (map[string]Key, error) {
	all, err := r.List(ctx, tenant, Filter{Box: box})
	if err != nil {
		return nil, err
	}
	out := make(map[string]Key, len(all))
	for _, k := range all {
		out[k.ID] = k
	}
	return out, nil
}

// Filter selects keys.
type Filter struct {
	Box    string
	Labels map[string]string // every one must match
}

// List returns the tenant's keys that f selects, by box and port.
func (r *Registry) List(ctx context.Context, tenant string, f Filter) ([]Key, error) {
	kvs, _, err := r.s.Range(ctx, "keys/"+tenant+"/", 0)
	if err != nil {
		return nil, err
	}
	var out []Key
	for _, kv := range kvs {
		var k Key
		if err := json.Unmarshal(kv.Value, &k); err != nil {
			return nil, fmt.Errorf("keys: %s: %w", kv.Key, err)
		}
		if f.Box != "" && k.BoxID != f.Box {
			continue
		}
		match := true
		for lk, lv := range f.Labels {
			if k.Labels[lk] != lv {
				match = false
			}
		}
		if match {
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].BoxID != out[j].BoxID {
			return out[i].BoxID < out[j].BoxID
		}
		return out[i].Port < out[j].Port
	})
	return out, nil
}

// Get returns one key.
func (r *Registry) Get(ctx context.Context, tenant, id string) (Key, store.KV, error) {
	var k Key
	kv, err := r.s.Get(ctx, keyKey(tenant, id))
	if errors.Is(err, store.ErrNotFound) {
		return k, kv, errdefs.NotFound("no key %q; 'edgebox keys ls' lists them", id)
	} else if err != nil {
		return k, kv, err
	}
	return k, kv, json.Unmarshal(kv.Value, &k)
}

// update changes a key if nobody changed it meanwhile. With act, the
// audit entry act returns for the changed key is written with the change.
func (r *Registry) update(ctx context.Context, tenant, id string, change func(*Key) (Entry, error), act func(Key) audit.Entry) (Key, error) {
	for range 20 {
		k, kv, err := r.Get(ctx, tenant, id)
		if err != nil {
			return k, err
		}
		e, err := change(&k)
		if err != nil {
			return k, err
		}
		now := r.now().UTC()
		k.LastChange = now
		e.Time = now
		raw, _ := json.Marshal(k)
		ev, _ := json.Marshal(e)
		ops := []store.Op{{Key: kv.Key, Value: raw}, {Key: fmt.Sprintf("%s%020d", histPrefix(tenant, id), now.UnixNano()), Value: ev}}
		if act != nil {
			ops = append(ops, audit.Op(now, act(k)))
		}
		res, err := r.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}}, Then: ops})
		if err != nil {
			return k, err
		}
		if res.Succeeded {
			return k, r.trim(ctx, tenant, id)
		}
	}
	return Key{}, errdefs.Unavailable("key %s is changing too often; try again", id)
}

// Label sets (value "") or removes labels of a key.
func (r *Registry) Label(ctx context.Context, who audit.Actor, id string, set map[string]string) (Key, error) {
	if err := fleet.ValidateLabels(set); err != nil {
		return Key{}, err
	}
	return r.update(ctx, who.TenantID, id, func(k *Key) (Entry, error) {
		if k.Labels == nil {
			k.Labels = map[string]string{}
		}
		var parts []string
		for lk, lv := range set {
			if lv == "" {
				delete(k.Labels, lk)
				parts = append(parts, lk+"-")
			} else {
				k.Labels[lk] = lv
				parts = append(parts, lk+"="+lv)
			}
		}
		sort.Strings(parts)
		return Entry{Event: "label", Actor: who.Name, Detail: strings.Join(parts, ",")}, nil
	}, func(k Key) audit.Entry { return who.Did("key.label", k.ID, "") })
}

func assignmentName(id string) string { return "ukey-" + strings.TrimPrefix(id, "k-") }

// Lease gives a key to one workload on the key's box: exclusively, or
// not at all. The box gets a UsbAssignment object.
func (r *Registry) Lease(ctx context.Context, who audit.Actor, id, workload string) (Key, error) {
	return r.Attach(ctx, who, id, workload, "")
}

// Attach gives a key to one workload on box, or on the key's own box
// when box is "" or that box: exclusively, or not at all. A key used
// from another box becomes a UsbAssignment on both boxes (exported from
// the key's, imported on the holder's), and travels between them on
// usbip streams the console splices while the lease lasts. Attaching a
// key to the holder it has already writes the boxes' assignments again
// (what a console killed between the two left undone) and is no error.
// The caller checks that box is a box of the caller's tenant.
func (r *Registry) Attach(ctx context.Context, who audit.Actor, id, workload, box string) (Key, error) {
	if !edgeboxv1.ValidObjectName(workload) {
		return Key{}, errdefs.Invalid("workload %q is not a valid name", workload)
	}
	if err := r.canUseRemotely(ctx, who.TenantID, id, box); err != nil {
		return Key{}, err
	}
	again := false
	k, err := r.update(ctx, who.TenantID, id, func(k *Key) (Entry, error) {
		to := box
		if to == k.BoxID {
			to = ""
		}
		switch {
		case k.Holder == workload && k.HolderBox == to:
			again = true
			return Entry{}, errAgain
		case k.Holder != "":
			return Entry{}, errdefs.Conflict("key %s is leased to workload %s (since %s, by %s); release it first",
				id, holderText(*k), k.LeasedAt.Format(time.RFC3339), k.LeasedBy)
		}
		k.Holder, k.HolderBox, k.LeasedAt, k.LeasedBy = workload, to, r.now().UTC(), who.Name
		detail := ""
		if to != "" {
			detail = "used from box " + to + " (the key is on box " + k.BoxID + ")"
		}
		return Entry{Event: "lease", Workload: workload, Actor: who.Name, Detail: detail}, nil
	}, func(k Key) audit.Entry {
		if k.HolderBox != "" {
			return who.Did("key.lease", k.ID, "to workload "+holderText(k)+", the key on box "+k.BoxID)
		}
		return who.Did("key.lease", k.ID, "to workload "+k.Holder+" on box "+k.BoxID)
	})
	if again {
		k, _, err = r.Get(ctx, who.TenantID, id)
	}
	if err != nil {
		return k, err
	}
	return k, r.assign(ctx, k)
}

// RemoteCapability is the agent capability version that uses keys of
// other boxes and serves its own to them.
const RemoteCapability = 3

// canUseRemotely refuses a lease of key id to box, another box than the
// key's, while either box runs an agent too old to carry it.
func (r *Registry) canUseRemotely(ctx context.Context, tenant, id, box string) error {
	k, _, err := r.Get(ctx, tenant, id)
	if err != nil || box == "" || box == k.BoxID {
		return err
	}
	for _, b := range []string{k.BoxID, box} {
		v, known, err := r.desired.ServedCapability(ctx, b)
		if err != nil {
			return err
		}
		if known && v < RemoteCapability {
			return errdefs.Conflict("box %s runs an agent too old to use a key of another box or serve one; update its agent first", b)
		}
	}
	return nil
}

// errAgain stops an update that would change nothing.
var errAgain = errors.New("keys: no change")

// holderText names a key's holder: "robot", or "robot on box b-2" when
// it is used from another box.
func holderText(k Key) string {
	if k.HolderBox != "" {
		return k.Holder + " on box " + k.HolderBox
	}
	return k.Holder
}

// assign writes the UsbAssignment objects of k's lease: on the key's box,
// and on the holder's box when it is another.
func (r *Registry) assign(ctx context.Context, k Key) error {
	u := &edgeboxv1.UsbAssignment{KeyId: k.ID, Workload: k.Holder, PortPath: k.Port, Serial: k.Serial, ExportTo: k.HolderBox}
	if _, err := r.desired.Put(ctx, k.BoxID, &edgeboxv1.DesiredObject{Name: assignmentName(k.ID),
		Spec: &edgeboxv1.DesiredObject_UsbAssignment{UsbAssignment: u}}); err != nil {
		return err
	}
	if k.HolderBox == "" {
		return nil
	}
	imp := &edgeboxv1.UsbAssignment{KeyId: k.ID, Workload: k.Holder, PortPath: k.Port, Serial: k.Serial, ImportFrom: k.BoxID}
	_, err := r.desired.Put(ctx, k.HolderBox, &edgeboxv1.DesiredObject{Name: assignmentName(k.ID),
		Spec: &edgeboxv1.DesiredObject_UsbAssignment{UsbAssignment: imp}})
	return err
}

// Release ends a key's lease; the boxes drop their assignments, and a
// stream carrying the key to another box is cut.
func (r *Registry) Release(ctx context.Context, who audit.Actor, id string) (Key, error) {
	var was Key
	k, err := r.update(ctx, who.TenantID, id, func(k *Key) (Entry, error) {
		if k.Holder == "" {
			return Entry{}, errdefs.Conflict("key %s is not leased", id)
		}
		was = *k
		k.Holder, k.HolderBox, k.LeasedAt, k.LeasedBy = "", "", time.Time{}, ""
		return Entry{Event: "release", Workload: holderText(was), Actor: who.Name}, nil
	}, func(k Key) audit.Entry {
		if was.HolderBox != "" {
			return who.Did("key.release", k.ID, "on box "+k.BoxID+", from workload "+holderText(was))
		}
		return who.Did("key.release", k.ID, "on box "+k.BoxID)
	})
	if err != nil {
		return k, err
	}
	if was.HolderBox != "" {
		if _, err := r.desired.Delete(ctx, was.HolderBox, edgeboxv1.KindUsbAssignment, assignmentName(k.ID)); err != nil {
			return k, err
		}
	}
	_, err = r.desired.Delete(ctx, k.BoxID, edgeboxv1.KindUsbAssignment, assignmentName(k.ID))
	return k, err
}

// History returns a key's history, oldest first.
func (r *Registry) History(ctx context.Context, tenant, id string) ([]Entry, error) {
	if _, _, err := r.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	kvs, _, err := r.s.Range(ctx, histPrefix(tenant, id), 0)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(kvs))
	for _, kv := range kvs {
		var e Entry
		if err := json.Unmarshal(kv.Value, &e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// matches says whether a key carries every label of need.
func matches(k Key, need map[string]string) bool {
	for lk, lv := range need {
		if k.Labels[lk] != lv {
			return false
		}
	}
	return true
}

func needText(need map[string]string) string {
	parts := make([]string, 0, len(need))
	for k, v := range need {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// EnsureLeases gives workload on box one key for each need (keys it holds
// already count first), and releases keys it holds beyond its needs. It
// says which needs no free key on the box meets. Each lease and release
// is who's, audited as Lease and Release are.
func (r *Registry) EnsureLeases(ctx context.Context, who audit.Actor, box, workload string, needs []map[string]string) error {
	ks, err := r.List(ctx, who.TenantID, Filter{Box: box})
	if err != nil {
		return err
	}
	used := map[string]bool{}
	var missing []string
	var errs []error
	for _, need := range needs {
		id, err := r.leaseFor(ctx, who, ks, used, workload, need)
		switch {
		case err != nil:
			errs = append(errs, err)
		case id == "":
			missing = append(missing, needText(need))
		default:
			used[id] = true
		}
	}
	for _, k := range ks {
		if k.Holder == workload && k.HolderBox == "" && !used[k.ID] {
			if _, err := r.Release(ctx, who, k.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(missing) > 0 {
		errs = append(errs, errdefs.Conflict("box %s has no free key with %s for %s", box, strings.Join(missing, "; "), workload))
	}
	return errors.Join(errs...)
}

// MissingKeys says, without leasing anything, which of needs workload on
// box would find no key for: keys it holds count first, then free
// present ones, one key a need. It is what EnsureLeases would report.
func (r *Registry) MissingKeys(ctx context.Context, tenant, box, workload string, needs []map[string]string) ([]string, error) {
	ks, err := r.List(ctx, tenant, Filter{Box: box})
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	var missing []string
	for _, need := range needs {
		found := ""
		for _, k := range ks {
			if k.Holder == workload && k.HolderBox == "" && !used[k.ID] && matches(k, need) {
				found = k.ID
				break
			}
		}
		for _, k := range ks {
			if found != "" {
				break
			}
			if k.Holder == "" && k.State != Absent && !used[k.ID] && matches(k, need) {
				found = k.ID
			}
		}
		if found == "" {
			missing = append(missing, needText(need))
			continue
		}
		used[found] = true
	}
	return missing, nil
}

// leaseFor finds workload a key of ks for need, not used yet: one it holds
// already, else a free one it leases. It returns "" when there is none.
func (r *Registry) leaseFor(ctx context.Context, who audit.Actor, ks []Key, used map[string]bool, workload string, need map[string]string) (string, error) {
	for _, k := range ks {
		if k.Holder == workload && k.HolderBox == "" && !used[k.ID] && matches(k, need) {
			return k.ID, nil
		}
	}
	for _, k := range ks {
		if k.Holder != "" || k.State == Absent || used[k.ID] || !matches(k, need) {
			continue
		}
		_, err := r.Lease(ctx, who, k.ID, workload)
		if errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrNotFound) {
			continue // taken or gone meanwhile: try the next
		}
		if err != nil {
			return "", err
		}
		return k.ID, nil
	}
	return "", nil
}

// box events of keys, as the agent names them.
var keyEvents = map[string]string{edgeboxv1.ReasonPowerCycled: "power-cycle", edgeboxv1.ReasonPowerCycleFailed: "power-cycle-failed",
	edgeboxv1.ReasonBroken: "broken", edgeboxv1.ReasonAttached: "attach", edgeboxv1.ReasonDetached: "detach",
	edgeboxv1.ReasonNotAttachable: "not-attachable"}

// BoxEvent records what a box did with one of its own keys (attached to
// or detached from a workload, power-cycled, given up on, or why it could
// not give it), or with a key of another box that one of its workloads
// holds; events about other keys are ignored.
func (r *Registry) BoxEvent(ctx context.Context, b fleet.Box, e *edgeboxv1.Event) error {
	event, ok := keyEvents[e.GetReason()]
	if !ok {
		return nil
	}
	k, _, err := r.Get(ctx, b.TenantID, e.GetName())
	if err != nil || (k.BoxID != b.ID && (k.HolderBox != b.ID || k.HolderBox == "")) {
		return nil
	}
	_, err = r.update(ctx, b.TenantID, k.ID, func(k *Key) (Entry, error) {
		actor := "box"
		if k.BoxID != b.ID {
			actor = "box " + b.ID // the holder's box
		} else if event == "broken" {
			k.Broken = true
		}
		return Entry{Event: event, Actor: actor, Workload: holderText(*k), Detail: clean(e.GetMessage())}, nil
	}, nil)
	return err
}

// Remote returns key id when a workload on box holds it from another box,
// with the revision the key was read at; else why box may not use it.
func (r *Registry) Remote(ctx context.Context, tenant, id, box string) (Key, int64, error) {
	k, kv, err := r.Get(ctx, tenant, id)
	switch {
	case err != nil:
		return k, 0, err
	case k.Holder == "":
		return k, 0, errdefs.Permission("key %s is not leased", id)
	case k.HolderBox != box:
		return k, 0, errdefs.Permission("key %s is leased to workload %s, not to a workload of box %s", id, holderText(k), box)
	}
	return k, kv.ModRevision, nil
}

// Watch sends key id of tenant each time it changes after revision from;
// the channel closes when ctx ends, the key is deleted, or the watch fails.
func (r *Registry) Watch(ctx context.Context, tenant, id string, from int64) <-chan Key {
	out := make(chan Key)
	go func() {
		defer close(out)
		for resp := range r.s.Watch(ctx, keyKey(tenant, id), from+1) {
			if resp.Err != nil {
				return
			}
			for _, ev := range resp.Events {
				var k Key
				if ev.KV.Key != keyKey(tenant, id) {
					continue // another key whose ID begins with this one's
				}
				if ev.Type == store.EventDelete || json.Unmarshal(ev.KV.Value, &k) != nil {
					return
				}
				select {
				case out <- k:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// RemoteEvent writes into a key's history what the console did carrying
// it between two boxes ("remote-attach", "remote-detach").
func (r *Registry) RemoteEvent(ctx context.Context, tenant, id, event, detail string) error {
	_, err := r.update(ctx, tenant, id, func(k *Key) (Entry, error) {
		return Entry{Event: event, Actor: "console", Workload: holderText(*k), Detail: clean(detail)}, nil
	}, nil)
	return err
}
