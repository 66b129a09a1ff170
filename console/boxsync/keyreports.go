package boxsync

import (
	"context"
	"errors"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// KeyReports is the StatusHook that passes what a box's status says of its
// USB keys to the key registry: its inventory, and the events of its keys.
func KeyReports(fl *fleet.Fleet, reg *keys.Registry) StatusHook {
	return func(ctx context.Context, box string, st *edgeboxv1.SyncStatus) error {
		return keyReports(ctx, fl, reg, box, st)
	}
}

func keyReports(ctx context.Context, fl *fleet.Fleet, reg *keys.Registry, box string, st *edgeboxv1.SyncStatus) error {
	hasKeyEvents := false
	for _, e := range st.GetEvents() {
		hasKeyEvents = hasKeyEvents || e.GetKind() == edgeboxv1.KindKey
	}
	if !st.GetUsbReport() && !hasKeyEvents {
		return nil
	}
	b, err := fl.BoxByID(ctx, box)
	if err != nil {
		return err
	}
	var errs []error
	if st.GetUsbReport() {
		errs = append(errs, reg.Report(ctx, b, st.GetUsb()))
	}
	for _, e := range st.GetEvents() {
		if e.GetKind() == edgeboxv1.KindKey {
			errs = append(errs, reg.BoxEvent(ctx, b, e))
		}
	}
	return errors.Join(errs...)
}
