package registry

import (
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/edgebox/edgebox/errdefs"
)

// Ref is an image reference split into its parts.
type Ref struct {
	Host   string // "" when the reference names none
	Repo   string
	Tag    string
	Digest digest.Digest
}

// ParseRef splits an image reference such as
// console.example:8443/robots/icbc:1.2 or .../icbc@sha256:…. It does not
// add docker.io to a reference without a host.
func ParseRef(s string) (Ref, error) {
	if len(s) > 512 {
		return Ref{}, errdefs.Invalid("image reference is longer than 512 characters")
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return Ref{}, errdefs.Invalid("image reference %q: %w", s, err)
	}
	r := refOf(named)
	if !strings.HasPrefix(s, r.Host+"/") {
		r.Host = "" // normalizing added docker.io
	}
	return r, nil
}

func refOf(named reference.Named) Ref {
	r := Ref{Host: reference.Domain(named), Repo: reference.Path(named)}
	if t, ok := named.(reference.Tagged); ok {
		r.Tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		r.Digest = d.Digest()
	}
	return r
}

// String writes the reference back, host first when there is one.
func (r Ref) String() string {
	s := r.Repo
	if r.Host != "" {
		s = r.Host + "/" + s
	}
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest.String()
	}
	return s
}
