package rollout

import (
	"math"
	"strconv"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
)

// Size is how far a wave takes a region: a number of boxes, or a share
// of them. Sizes are cumulative: 1, 10 %, 50 %, 100 % means one box, then
// up to a tenth, then half, then all.
type Size struct {
	Boxes   int     `json:"boxes,omitempty"`   // when Percent is 0
	Percent float64 `json:"percent,omitempty"` // of the region's boxes, 0 < Percent <= 100
}

// DefaultWaves are one box, then 10 %, 50 % and 100 % of each region.
var DefaultWaves = []Size{{Boxes: 1}, {Percent: 10}, {Percent: 50}, {Percent: 100}}

// maxWaves bounds how many waves a rollout may name.
const maxWaves = 20

// ParseWaves reads wave sizes such as "1", "10%", "50%", "100%". The last
// wave must take the region whole, and each must take at least as far as
// the one before.
func ParseWaves(in []string) ([]Size, error) {
	if len(in) == 0 {
		return DefaultWaves, nil
	}
	if len(in) > maxWaves {
		return nil, errdefs.Invalid("at most %d waves", maxWaves)
	}
	out := make([]Size, 0, len(in))
	for _, s := range in {
		s = strings.TrimSpace(s)
		var sz Size
		if p, ok := strings.CutSuffix(s, "%"); ok {
			f, err := strconv.ParseFloat(p, 64)
			if err != nil || !(f > 0 && f <= 100) || math.IsNaN(f) {
				return nil, errdefs.Invalid("wave %q: a share must be above 0 %% and at most 100 %%", trunc(s))
			}
			sz.Percent = f
		} else {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 1_000_000 {
				return nil, errdefs.Invalid("wave %q: give a number of boxes from 1, or a share such as 10%%", trunc(s))
			}
			sz.Boxes = n
		}
		out = append(out, sz)
	}
	if last := out[len(out)-1]; last.Percent != 100 {
		return nil, errdefs.Invalid("the last wave must be 100%%, so every box of the region is reached")
	}
	for i := 1; i < len(out); i++ {
		a, b := out[i-1], out[i]
		if a.Percent > 0 && b.Percent > 0 && b.Percent < a.Percent {
			return nil, errdefs.Invalid("waves must grow: %g%% after %g%%", b.Percent, a.Percent)
		}
		if a.Percent == 0 && b.Percent == 0 && b.Boxes < a.Boxes {
			return nil, errdefs.Invalid("waves must grow: %d boxes after %d", b.Boxes, a.Boxes)
		}
	}
	return out, nil
}

// upTo is how many of n boxes the wave takes the region to, at least one.
func (s Size) upTo(n int) int {
	if n == 0 {
		return 0
	}
	k := s.Boxes
	if s.Percent > 0 {
		k = int(math.Ceil(s.Percent / 100 * float64(n)))
	}
	return max(1, min(k, n))
}

// Plan splits a region's boxes, in the order given, into waves of sizes:
// wave i holds the boxes that take the region from wave i-1's reach to
// its own. Waves that would add nothing (a small region) are left out, so
// every wave has a box.
func Plan(boxes []string, sizes []Size) [][]string {
	var waves [][]string
	done := 0
	for _, s := range sizes {
		k := s.upTo(len(boxes))
		if k <= done {
			continue
		}
		waves = append(waves, boxes[done:k])
		done = k
	}
	return waves
}
