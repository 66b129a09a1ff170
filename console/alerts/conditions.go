package alerts

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/console/sitehealth"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Facts is what the rules look at: the console's parts, each read as it
// is now.
type Facts struct {
	Boxes    func(ctx context.Context, tenant string) ([]fleet.Box, error)
	Health   func(ctx context.Context, b fleet.Box) (sitehealth.State, string)
	Keys     func(ctx context.Context, tenant string) ([]keys.Key, error)
	Statuses func(ctx context.Context, box string) ([]*edgeboxv1.ObjectStatus, error)
	Rollouts func(ctx context.Context, tenant string) ([]rollout.Rollout, error)
}

// conditions returns what holds a condition of one of the tenant's rules
// now; it reads only what its rules need.
func (s *Service) conditions(ctx context.Context, tenant string, r Rules) ([]condition, error) {
	if len(r.Rules) == 0 {
		return nil, nil
	}
	f := s.cfg.Facts
	var out []condition
	_, offline := r.rule(BoxOffline)
	_, down := r.rule(BoxDown)
	certRule, certs := r.rule(CertExpiry)
	_, workloads := r.rule(WorkloadUnhealthy)
	_, keyRule := r.rule(KeyBroken)
	boxes, err := f.Boxes(ctx, tenant)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]fleet.Box, len(boxes))
	now := s.cfg.Now()
	for _, b := range boxes {
		byID[b.ID] = b
		if b.State != fleet.StateApproved {
			continue
		}
		onBox := func(k Kind, key, subject, summary string) condition {
			return condition{kind: k, key: string(k) + "/" + key, subject: subject, summary: summary,
				box: b.ID, boxName: b.Name, site: b.Site, region: b.Region}
		}
		if offline || down {
			state, detail := f.Health(ctx, b)
			if offline && state != sitehealth.Online {
				out = append(out, onBox(BoxOffline, b.ID, "box "+b.Name, fmt.Sprintf("no tunnel; %s: %s", state, detail)))
			}
			if down && state == sitehealth.Down {
				out = append(out, onBox(BoxDown, b.ID, "box "+b.Name, "down: "+detail))
			}
		}
		if certs && !b.CertNotAfter.IsZero() && b.CertNotAfter.Sub(now) < time.Duration(certRule.Days)*24*time.Hour {
			out = append(out, onBox(CertExpiry, b.ID, "box "+b.Name,
				fmt.Sprintf("its certificate ends %s (%s from now)", b.CertNotAfter.UTC().Format(time.RFC3339), b.CertNotAfter.Sub(now).Round(time.Minute))))
		}
		if workloads {
			sts, err := f.Statuses(ctx, b.ID)
			if err != nil {
				return nil, err
			}
			for _, st := range sts {
				if st.GetKind() != edgeboxv1.KindWorkload {
					continue
				}
				var what string
				switch {
				case st.GetPhase() == edgeboxv1.PhaseFailed:
					what = fmt.Sprintf("failed (%s): %s", st.GetReason(), st.GetMessage())
				case st.GetHealth() == edgeboxv1.Unhealthy:
					what = fmt.Sprintf("its probes fail; restarted %d times", st.GetRestarts())
				default:
					continue
				}
				out = append(out, onBox(WorkloadUnhealthy, b.ID+"/"+st.GetName(), "workload "+st.GetName()+" on box "+b.Name, what))
			}
		}
	}
	if keyRule {
		ks, err := f.Keys(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, k := range ks {
			var what string
			switch {
			case k.Broken:
				what = "broken: the box gave up power-cycling it; it needs a visit"
			case k.State == keys.Stuck:
				what = "stuck: it stopped answering"
			default:
				continue
			}
			if k.Holder != "" {
				what += "; leased to " + k.Holder
			}
			b := byID[k.BoxID]
			subject := "key " + k.ID
			if d := strings.TrimSpace(k.Product + " " + k.Serial); d != "" {
				subject += " (" + d + ")"
			}
			out = append(out, condition{kind: KeyBroken, key: string(KeyBroken) + "/" + k.ID,
				subject: subject + " on box " + b.Name, summary: what,
				box: b.ID, boxName: b.Name, site: b.Site, region: b.Region})
		}
	}
	if _, ok := r.rule(RolloutStopped); ok {
		rs, err := f.Rollouts(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, ro := range rs {
			if ro.State == rollout.Stopped {
				out = append(out, condition{kind: RolloutStopped, key: string(RolloutStopped) + "/" + ro.ID,
					subject: fmt.Sprintf("rollout %s of %s %s → %s", ro.ID, ro.App, ro.From, ro.To), summary: "stopped: " + ro.Reason})
			}
		}
	}
	return out, nil
}
