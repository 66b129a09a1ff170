//go:build !linux

package usbhub

import (
	"context"
	"errors"
)

// ListenUevents: only Linux has kernel uevents; other systems poll.
func ListenUevents(context.Context, func(Uevent) bool) (<-chan Uevent, error) {
	return nil, errors.New("usbhub: no kernel uevents on this system")
}
