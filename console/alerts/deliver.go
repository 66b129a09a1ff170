package alerts

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// notice is one post owed to one webhook, kept in the outbox until the
// webhook answers 2xx or GiveUpAfter passes.
type notice struct {
	Key      string    `json:"key"` // under alerts/outbox/: created time and ID, so the oldest go first
	ID       string    `json:"id"`  // the delivery's ID, the same on every try: receivers drop repeats by it
	TenantID string    `json:"tenant_id"`
	URL      string    `json:"url"`
	Status   string    `json:"status"` // firing or resolved (or test, never kept)
	Incident Incident  `json:"incident"`
	Created  time.Time `json:"created"`
	Tries    int       `json:"tries,omitempty"`
	NextAt   time.Time `json:"next_at,omitzero"`
	Error    string    `json:"error,omitempty"` // of the last try
}

// Payload is what a webhook receives.
type Payload struct {
	// Delivery is the same on every try of one notice.
	Delivery string   `json:"delivery"`
	Status   string   `json:"status"` // firing, resolved, or test
	Tenant   string   `json:"tenant"`
	Console  string   `json:"console,omitempty"`
	Incident Incident `json:"incident"`
}

// noticesFor makes the notices of one incident's change, one a webhook.
func noticesFor(r Rules, in Incident, status string, now time.Time) []notice {
	out := make([]notice, 0, len(r.Webhooks))
	for _, w := range r.Webhooks {
		id := newID()
		out = append(out, notice{Key: fmt.Sprintf("%020d-%s", now.UnixNano(), id), ID: id, TenantID: in.TenantID,
			URL: w.URL, Status: status, Incident: in, Created: now})
	}
	return out
}

// maxPostsAtOnce bounds the posts in flight; a webhook that hangs holds
// one slot for PostTimeout.
const maxPostsAtOnce = 8

// deliver posts what is due in the outbox, and returns when the next
// notice that waits is due (zero: none waits).
func (s *Service) deliver(ctx context.Context) (time.Time, error) {
	d := &round{now: s.cfg.Now(), sem: make(chan struct{}, maxPostsAtOnce)}
	for after := ""; ; {
		kvs, _, err := s.cfg.Store.Scan(ctx, outboxPrefix, after, 500)
		if err != nil || len(kvs) == 0 {
			d.wg.Wait()
			return d.next, err
		}
		after = kvs[len(kvs)-1].Key
		if !s.deliverPage(ctx, kvs, d) {
			d.wg.Wait()
			return d.next, nil
		}
	}
}

// round is one pass over the outbox.
type round struct {
	now time.Time
	sem chan struct{} // a slot a post in flight
	wg  sync.WaitGroup
	mu  sync.Mutex // guards next
	// next is when the first notice that waits is due; zero when none.
	next time.Time
}

func (d *round) waits(at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.next.IsZero() || at.Before(d.next) {
		d.next = at
	}
}

// deliverPage starts the posts of one page of the outbox that are due,
// and notes when the first of those that wait is due. It returns false
// when ctx ended.
func (s *Service) deliverPage(ctx context.Context, kvs []store.KV, d *round) bool {
	for _, kv := range kvs {
		var n notice
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			s.cfg.Log.Error("alerts: dropping a notice the outbox cannot read", "key", kv.Key, "err", err)
			s.cfg.Store.Txn(ctx, store.Txn{Then: []store.Op{{Key: kv.Key, Delete: true}}})
			continue
		}
		if n.NextAt.After(d.now) {
			d.waits(n.NextAt)
			continue
		}
		select {
		case d.sem <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer func() { <-d.sem }()
			if retry := s.post(ctx, kv, n); !retry.IsZero() {
				d.waits(retry)
			}
		}()
	}
	return true
}

// post tries one notice once, and takes it out of the outbox when the
// webhook took it, or when it can no longer be delivered. It returns
// when to try again, or zero.
func (s *Service) post(ctx context.Context, kv store.KV, n notice) time.Time {
	rules, _, err := s.rules(ctx, n.TenantID)
	if err != nil {
		return s.cfg.Now().Add(s.cfg.RetryMin)
	}
	secret, listed := rules.secret(n.URL)
	done := func(result string) {
		s.deliveries.WithLabelValues(result).Inc()
		s.cfg.Store.Txn(ctx, store.Txn{If: []store.Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}},
			Then: []store.Op{{Key: kv.Key, Delete: true}}})
	}
	if !listed {
		s.cfg.Log.Info("alerts: a notice's webhook is no longer listed; dropped", "tenant", n.TenantID, "url", n.URL, "incident", n.Incident.ID)
		done("dropped")
		return time.Time{}
	}
	err = s.send(ctx, n, secret)
	if err == nil {
		done("ok")
		return time.Time{}
	}
	if ctx.Err() != nil {
		return time.Time{}
	}
	now := s.cfg.Now()
	if now.Sub(n.Created) >= s.cfg.GiveUpAfter {
		s.cfg.Log.Error("alerts: a webhook did not take a notice; gave up", "tenant", n.TenantID, "url", n.URL,
			"incident", n.Incident.ID, "status", n.Status, "tries", n.Tries+1, "err", err)
		done("gave-up")
		return time.Time{}
	}
	s.deliveries.WithLabelValues("failed").Inc()
	n.Tries++
	n.NextAt, n.Error = now.Add(s.backoff(n.Tries)), err.Error()
	s.cfg.Log.Warn("alerts: a webhook did not take a notice; will try again", "tenant", n.TenantID, "url", n.URL,
		"incident", n.Incident.ID, "tries", n.Tries, "next", n.NextAt, "err", err)
	raw, err := json.Marshal(n)
	if err == nil {
		s.cfg.Store.Txn(ctx, store.Txn{If: []store.Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}},
			Then: []store.Op{{Key: kv.Key, Value: raw}}})
	}
	return n.NextAt
}

// backoff is the wait after the tries-th failed try: RetryMin doubling
// to RetryMax, with a quarter of jitter so that a webhook back up is not
// met by every notice at once.
func (s *Service) backoff(tries int) time.Duration {
	d := min(s.cfg.RetryMin<<min(tries-1, 20), s.cfg.RetryMax)
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

// send posts n to its webhook, signed with secret when there is one.
func (s *Service) send(ctx context.Context, n notice, secret string) error {
	body, err := json.Marshal(Payload{Delivery: n.ID, Status: n.Status, Tenant: n.TenantID, Console: s.cfg.ConsoleURL, Incident: n.Incident})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PostTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "edgebox-console")
	req.Header.Set("X-Edgebox-Delivery", n.ID)
	if secret != "" {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(body)
		req.Header.Set("X-Edgebox-Signature", "sha256="+hex.EncodeToString(m.Sum(nil)))
	}
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the webhook answered %s", resp.Status)
	}
	return nil
}

// TestResult is what one webhook said to a test notice: nothing, or why
// it did not take it.
type TestResult struct {
	URL   string
	Error string
}

// Test posts a test notice to each of the caller's tenant's webhooks now,
// once, and says what each answered.
func (s *Service) Test(ctx context.Context, who audit.Actor) ([]TestResult, error) {
	rules, _, err := s.rules(ctx, who.TenantID)
	if err != nil {
		return nil, err
	}
	if len(rules.Webhooks) == 0 {
		return nil, errdefs.Invalid("the tenant has no webhooks to test: set them in its alert rules")
	}
	now := s.cfg.Now().UTC()
	e := who.Did("alerts.test", "alert-rules", fmt.Sprintf("a test notice to %d webhooks", len(rules.Webhooks)))
	if _, err := s.cfg.Store.Txn(ctx, store.Txn{Then: []store.Op{audit.Op(now, e)}}); err != nil {
		return nil, err
	}
	in := Incident{ID: newID(), TenantID: who.TenantID, Kind: "test", Subject: "a test notice", Summary: "sent by " + who.Name,
		State: Firing, Since: now, FiredAt: now}
	out := make([]TestResult, len(rules.Webhooks))
	var wg sync.WaitGroup
	for i, n := range noticesFor(rules, in, "test", now) {
		out[i].URL = n.URL
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.send(ctx, n, rules.Webhooks[i].Secret); err != nil {
				out[i].Error = err.Error()
			}
		}()
	}
	wg.Wait()
	return out, nil
}
