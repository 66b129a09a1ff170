package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// Where users and tenants live on the store.
const (
	UsersPrefix   = "auth/users/"
	TenantsPrefix = "auth/tenants/"
)

// User is a person (or a robot account) who logs in. Roles says what the
// user may do in each tenant; a user holds roles in one tenant or several.
type User struct {
	Name string `json:"name"`
	// ID tells this user from one made later under the same name: its
	// tokens and sessions name it, and die with it.
	ID           string          `json:"id,omitempty"`
	PasswordHash string          `json:"password_hash,omitempty"`
	Roles        map[string]Role `json:"roles"` // tenant ID -> role
	CreatedAt    time.Time       `json:"created_at"`
	// Epoch grows with each password change and each "log out
	// everywhere": a browser session of an older epoch is over.
	Epoch int64 `json:"epoch"`
}

// Tenants returns the IDs of the tenants u holds a role in, sorted.
func (u User) Tenants() []string { return slices.Sorted(maps.Keys(u.Roles)) }

// Tenant is one customer of the console: a bank's operations company, an
// integrator. Everything a tenant owns (boxes, apps, keys, audit) is
// stored under its ID and seen by its users only.
type Tenant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

var (
	userNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._@-]{0,63}$`)
	tenantRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
)

// CheckUserName says what is wrong with a user name, if anything.
func CheckUserName(name string) error {
	if !userNameRE.MatchString(name) {
		return errdefs.Invalid("user name %q: use 1 to 64 lower-case letters, digits, '.', '_', '@' or '-', starting with a letter or digit", trunc(name))
	}
	return nil
}

// CheckTenantID says what is wrong with a tenant ID, if anything.
func CheckTenantID(id string) error {
	if !tenantRE.MatchString(id) {
		return errdefs.Invalid("tenant %q: use 1 to 63 lower-case letters, digits or '-', starting with a letter or digit", trunc(id))
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Users keeps users, tenants and browser sessions on the console's store.
// Every change writes its audit entry in the same transaction. It is safe
// for concurrent use.
type Users struct {
	s   store.Store
	h   *Hasher
	now func() time.Time
}

// NewUsers returns Users on s, hashing passwords with h.
func NewUsers(s store.Store, h *Hasher, now func() time.Time) *Users {
	return &Users{s: s, h: h, now: now}
}

// Hasher returns the password hasher.
func (u *Users) Hasher() *Hasher { return u.h }

func userKey(name string) string { return UsersPrefix + name }

// Get returns the user called name and its record's revision.
func (u *Users) Get(ctx context.Context, name string) (User, int64, error) {
	var usr User
	if CheckUserName(name) != nil {
		return usr, 0, errdefs.NotFound("no user %q", trunc(name))
	}
	kv, err := u.s.Get(ctx, userKey(name))
	if errors.Is(err, store.ErrNotFound) {
		return usr, 0, errdefs.NotFound("no user %q", name)
	} else if err != nil {
		return usr, 0, fmt.Errorf("auth: reading user %s: %w", name, err)
	}
	if err := json.Unmarshal(kv.Value, &usr); err != nil {
		return usr, 0, fmt.Errorf("auth: user %s: %w", name, err)
	}
	return usr, kv.ModRevision, nil
}

// List returns the users who hold a role in tenant, or every user when
// tenant is "", by name.
func (u *Users) List(ctx context.Context, tenant string) ([]User, error) {
	kvs, _, err := u.s.Range(ctx, UsersPrefix, 0)
	if err != nil {
		return nil, fmt.Errorf("auth: listing users: %w", err)
	}
	var out []User
	for _, kv := range kvs {
		var usr User
		if err := json.Unmarshal(kv.Value, &usr); err != nil {
			return nil, fmt.Errorf("auth: user %s: %w", kv.Key, err)
		}
		if _, ok := usr.Roles[tenant]; tenant == "" || ok {
			out = append(out, usr)
		}
	}
	return out, nil
}

// Any reports whether any user exists yet.
func (u *Users) Any(ctx context.Context) (bool, error) {
	kvs, _, err := u.s.Range(ctx, UsersPrefix, 1)
	if err != nil {
		return false, fmt.Errorf("auth: %w", err)
	}
	return len(kvs) > 0, nil
}

// Create makes a user with a password and one role in tenant.
func (u *Users) Create(ctx context.Context, by audit.Actor, name, password, tenant string, role Role) (User, error) {
	if err := CheckUserName(name); err != nil {
		return User{}, err
	}
	if _, err := ParseRole(string(role)); err != nil {
		return User{}, err
	}
	if err := CheckPasswordRules(password); err != nil {
		return User{}, err
	}
	if _, err := u.Tenant(ctx, tenant); err != nil {
		return User{}, err
	}
	hash, err := u.h.Hash(ctx, password)
	if err != nil {
		return User{}, err
	}
	now := u.now().UTC()
	usr := User{Name: name, ID: randomText(12), PasswordHash: hash, Roles: map[string]Role{tenant: role}, CreatedAt: now}
	raw, err := json.Marshal(usr)
	if err != nil {
		return User{}, err
	}
	res, err := u.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: userKey(name)}}, Then: []store.Op{
		{Key: userKey(name), Value: raw},
		audit.Op(now, by.Did("user.create", name, fmt.Sprintf("%s in %s", role, tenant))),
	}})
	switch {
	case err != nil:
		return User{}, fmt.Errorf("auth: creating user %s: %w", name, err)
	case !res.Succeeded:
		return User{}, errdefs.Conflict("user %q exists; give it a role here with 'edgebox user role'", name)
	}
	return usr, nil
}

// update applies f to the user called name and writes it with the audit
// entry f returns, retrying when another change came between.
func (u *Users) update(ctx context.Context, name string, f func(*User) (audit.Entry, error)) (User, error) {
	for {
		usr, rev, err := u.Get(ctx, name)
		if err != nil {
			return User{}, err
		}
		e, err := f(&usr)
		if err != nil {
			return User{}, err
		}
		raw, err := json.Marshal(usr)
		if err != nil {
			return User{}, err
		}
		res, err := u.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: userKey(name), ModRevision: rev}},
			Then: []store.Op{{Key: userKey(name), Value: raw}, audit.Op(u.now(), e)}})
		if err != nil {
			return User{}, fmt.Errorf("auth: updating user %s: %w", name, err)
		}
		if res.Succeeded {
			return usr, nil
		}
	}
}

// SetRole gives the user called name role in tenant, or takes its role
// there away when role is "". A user left with no role keeps its record
// but can do nothing; Delete removes it.
func (u *Users) SetRole(ctx context.Context, by audit.Actor, name, tenant string, role Role) (User, error) {
	if role != "" {
		if _, err := ParseRole(string(role)); err != nil {
			return User{}, err
		}
	}
	if _, err := u.Tenant(ctx, tenant); err != nil {
		return User{}, err
	}
	return u.update(ctx, name, func(usr *User) (audit.Entry, error) {
		if usr.Roles == nil {
			usr.Roles = map[string]Role{}
		}
		if role == "" {
			delete(usr.Roles, tenant)
			return by.Did("user.role", name, "no role in "+tenant), nil
		}
		usr.Roles[tenant] = role
		return by.Did("user.role", name, fmt.Sprintf("%s in %s", role, tenant)), nil
	})
}

// RemoveRole takes the user's role in tenant away and, when that was its
// last, deletes the user, in one transaction: no other change can come
// between, and a crash leaves either the user as it was or the change
// whole. It reports whether the user was deleted.
func (u *Users) RemoveRole(ctx context.Context, by audit.Actor, name, tenant string) (bool, error) {
	for {
		usr, rev, err := u.Get(ctx, name)
		if err != nil {
			return false, err
		}
		delete(usr.Roles, tenant)
		op := store.Op{Key: userKey(name), Delete: true}
		e := by.Did("user.delete", name, "its last role, in "+tenant)
		if len(usr.Roles) > 0 {
			raw, err := json.Marshal(usr)
			if err != nil {
				return false, err
			}
			op = store.Op{Key: userKey(name), Value: raw}
			e = by.Did("user.role", name, "no role in "+tenant)
		}
		res, err := u.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: userKey(name), ModRevision: rev}},
			Then: []store.Op{op, audit.Op(u.now(), e)}})
		if err != nil {
			return false, fmt.Errorf("auth: removing user %s from %s: %w", name, tenant, err)
		}
		if res.Succeeded {
			return op.Delete, nil
		}
	}
}

// SetPassword changes the user's password and ends every browser session
// it has.
func (u *Users) SetPassword(ctx context.Context, by audit.Actor, name, password string) error {
	if err := CheckPasswordRules(password); err != nil {
		return err
	}
	hash, err := u.h.Hash(ctx, password)
	if err != nil {
		return err
	}
	_, err = u.update(ctx, name, func(usr *User) (audit.Entry, error) {
		usr.PasswordHash = hash
		usr.Epoch++
		return by.Did("user.passwd", name, ""), nil
	})
	return err
}

// LogOutEverywhere ends every browser session of the user.
func (u *Users) LogOutEverywhere(ctx context.Context, by audit.Actor, name string) error {
	_, err := u.update(ctx, name, func(usr *User) (audit.Entry, error) {
		usr.Epoch++
		return by.Did("user.logout_everywhere", name, ""), nil
	})
	return err
}

// Delete removes the user called name. Its API tokens stop working at once
// (a token's user must exist), and so do its sessions.
func (u *Users) Delete(ctx context.Context, by audit.Actor, name string) error {
	_, rev, err := u.Get(ctx, name)
	if err != nil {
		return err
	}
	res, err := u.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: userKey(name), ModRevision: rev}}, Then: []store.Op{
		{Key: userKey(name), Delete: true}, audit.Op(u.now(), by.Did("user.delete", name, "")),
	}})
	switch {
	case err != nil:
		return fmt.Errorf("auth: deleting user %s: %w", name, err)
	case !res.Succeeded:
		return errdefs.Conflict("user %q changed meanwhile; try again", name)
	}
	return nil
}

// Authenticate checks a user's password. Every failure, an unknown user
// included, is the same error and takes the same time.
func (u *Users) Authenticate(ctx context.Context, name, password string) (User, error) {
	bad := errdefs.Permission("wrong user name or password")
	if len(password) > MaxPassword {
		return User{}, bad
	}
	usr, _, err := u.Get(ctx, name)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return User{}, err
	}
	ok, verr := u.h.Verify(ctx, usr.PasswordHash, password)
	if verr != nil {
		return User{}, verr
	}
	if err != nil || !ok {
		return User{}, bad
	}
	return usr, nil
}

func tenantKey(id string) string { return TenantsPrefix + id }

// Tenant returns the tenant id. The console's own tenant always exists.
func (u *Users) Tenant(ctx context.Context, id string) (Tenant, error) {
	if CheckTenantID(id) != nil {
		return Tenant{}, errdefs.NotFound("no tenant %q", trunc(id))
	}
	kv, err := u.s.Get(ctx, tenantKey(id))
	if errors.Is(err, store.ErrNotFound) {
		if id == ConsoleTenant {
			return Tenant{ID: ConsoleTenant, Name: "Console"}, nil
		}
		return Tenant{}, errdefs.NotFound("no tenant %q", id)
	} else if err != nil {
		return Tenant{}, fmt.Errorf("auth: reading tenant %s: %w", id, err)
	}
	var t Tenant
	if err := json.Unmarshal(kv.Value, &t); err != nil {
		return Tenant{}, fmt.Errorf("auth: tenant %s: %w", id, err)
	}
	return t, nil
}

// Tenants returns every tenant, the console's own first.
func (u *Users) Tenants(ctx context.Context) ([]Tenant, error) {
	kvs, _, err := u.s.Range(ctx, TenantsPrefix, 0)
	if err != nil {
		return nil, fmt.Errorf("auth: listing tenants: %w", err)
	}
	out := []Tenant{{ID: ConsoleTenant, Name: "Console"}}
	for _, kv := range kvs {
		var t Tenant
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			return nil, fmt.Errorf("auth: tenant %s: %w", kv.Key, err)
		}
		if t.ID == ConsoleTenant {
			out[0] = t
			continue
		}
		out = append(out, t)
	}
	return out, nil
}

// CreateTenant makes a tenant.
func (u *Users) CreateTenant(ctx context.Context, by audit.Actor, id, name string) (Tenant, error) {
	if err := CheckTenantID(id); err != nil {
		return Tenant{}, err
	}
	if id == ConsoleTenant {
		return Tenant{}, errdefs.Conflict("tenant %q exists: it is the console's own", id)
	}
	name = strings.TrimSpace(name)
	if name == "" {
		name = id
	}
	if len(name) > 200 {
		return Tenant{}, errdefs.Invalid("a tenant's name may have at most 200 bytes")
	}
	now := u.now().UTC()
	t := Tenant{ID: id, Name: name, CreatedAt: now}
	raw, err := json.Marshal(t)
	if err != nil {
		return Tenant{}, err
	}
	guard := []store.Cmp{{Key: tenantKey(id)}}
	res, err := u.s.Txn(ctx, store.Txn{If: guard, Then: []store.Op{
		{Key: tenantKey(id), Value: raw}, audit.Op(now, by.Did("tenant.create", id, name)),
	}})
	switch {
	case err != nil:
		return Tenant{}, fmt.Errorf("auth: creating tenant %s: %w", id, err)
	case !res.Succeeded:
		return Tenant{}, errdefs.Conflict("tenant %q exists", id)
	}
	return t, nil
}
