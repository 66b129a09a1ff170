// Package alerts raises a tenant's incidents from its rules (a box
// offline or down for N minutes, a key stuck or broken, a workload
// unhealthy, a rollout stopped by its failure policy, a certificate near
// its end) and posts them to its webhooks: once when an incident fires,
// once when it is resolved, retried with back-off until a webhook takes
// them, and kept from the webhooks while a silence covers them.
//
// Incidents and the notices they owe live in the console's store: a
// notice is written in the same transaction as the change of its
// incident, so a console that stops at any point neither loses nor
// doubles one. A webhook may see a notice twice only when the console
// stopped between its 2xx answer and the notice's removal; each carries
// a delivery ID that stays the same across tries.
package alerts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/console/store"
)

// Config is what a Service needs.
type Config struct {
	Store store.Store
	// Tenants lists the tenants whose rules are evaluated.
	Tenants func(ctx context.Context) ([]string, error)
	Facts   Facts
	// Every is how often the rules are evaluated; 30 s when 0. A rule's
	// minutes count from the round that first saw its condition.
	Every time.Duration
	// RetryMin and RetryMax bound the wait between a webhook's failed
	// tries (5 s and 5 min when 0); GiveUpAfter drops a notice no webhook
	// took (24 h when 0). PostTimeout bounds one post (10 s when 0).
	RetryMin, RetryMax, GiveUpAfter, PostTimeout time.Duration
	// Client posts to the webhooks; a client that goes through the
	// environment's proxy when nil.
	Client *http.Client
	// ConsoleURL is in each payload, for links back.
	ConsoleURL string
	Now        func() time.Time
	Metrics    prometheus.Registerer
	Log        *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Every == 0 {
		c.Every = 30 * time.Second
	}
	if c.RetryMin == 0 {
		c.RetryMin = 5 * time.Second
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Minute
	}
	if c.GiveUpAfter == 0 {
		c.GiveUpAfter = 24 * time.Hour
	}
	if c.PostTimeout == 0 {
		c.PostTimeout = 10 * time.Second
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Service evaluates the rules and delivers the notices.
type Service struct {
	cfg        Config
	kick       chan struct{} // an evaluation is due now
	outbox     chan struct{} // the outbox has new notices
	deliveries *prometheus.CounterVec

	mu     sync.Mutex                   // guards counts
	counts map[string]map[[2]string]int // tenant → (kind, state) → incidents, from the last round
}

// New returns a Service; Run runs it.
func New(cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	f := cfg.Facts
	if cfg.Store == nil || cfg.Tenants == nil || f.Boxes == nil || f.Health == nil || f.Keys == nil || f.Statuses == nil || f.Rollouts == nil {
		return nil, errors.New("alerts: a store, the tenants and every fact are needed")
	}
	if cfg.RetryMin > cfg.RetryMax {
		return nil, fmt.Errorf("alerts: the shortest retry wait %v is longer than the longest %v", cfg.RetryMin, cfg.RetryMax)
	}
	s := &Service{cfg: cfg, kick: make(chan struct{}, 1), outbox: make(chan struct{}, 1), counts: map[string]map[[2]string]int{},
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "edgebox", Subsystem: "alerts", Name: "deliveries_total",
			Help: "Posts of alert notices to webhooks, by result: ok, failed (tried again later), gave-up, dropped (the webhook is no longer listed)."},
			[]string{"result"})}
	for _, result := range []string{"ok", "failed", "gave-up", "dropped"} {
		s.deliveries.WithLabelValues(result) // served from the start, at 0
	}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(s.deliveries); err != nil {
			return nil, err
		}
		if err := cfg.Metrics.Register(openIncidents{s}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Kick asks for an evaluation now, as after a change of rules.
func (s *Service) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Service) wakeOutbox() {
	select {
	case s.outbox <- struct{}{}:
	default:
	}
}

// Run evaluates the rules every period and delivers the notices until
// ctx ends. A failed round is logged and tried again next period.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.runOutbox(ctx)
	}()
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	for {
		if err := s.Evaluate(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("alerts: evaluation failed; trying again next round", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.kick:
		}
	}
}

// Evaluate runs one round over every tenant.
func (s *Service) Evaluate(ctx context.Context) error {
	tenants, err := s.cfg.Tenants(ctx)
	if err != nil {
		return err
	}
	var errs []error
	counts := map[string]map[[2]string]int{}
	for _, t := range tenants {
		c, err := s.evaluate(ctx, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", t, err))
			continue
		}
		counts[t] = c
	}
	s.mu.Lock()
	s.counts = counts
	s.mu.Unlock()
	return errors.Join(errs...)
}

// runOutbox delivers notices as they come and when their retries are due.
func (s *Service) runOutbox(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.outbox:
		}
		next, err := s.deliver(ctx)
		if err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("alerts: cannot read the outbox", "err", err)
		}
		// Look again when the first waiting notice is due, and at least
		// each period, for notices another console replica wrote.
		wait := s.cfg.Every
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(s.cfg.Now()), 10*time.Millisecond))
		}
		timer.Reset(wait)
	}
}

// openIncidents reports the incidents open at the last round.
type openIncidents struct{ s *Service }

var openDesc = prometheus.NewDesc("edgebox_alerts_open", "Alert incidents pending or firing at the last evaluation, by tenant, kind and state.",
	[]string{"tenant", "kind", "state"}, nil)

func (o openIncidents) Describe(ch chan<- *prometheus.Desc) { ch <- openDesc }

func (o openIncidents) Collect(ch chan<- prometheus.Metric) {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	for t, c := range o.s.counts {
		for k, n := range c {
			ch <- prometheus.MustNewConstMetric(openDesc, prometheus.GaugeValue, float64(n), t, k[0], k[1])
		}
	}
}
