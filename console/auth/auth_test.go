package auth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
)

func TestTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := storetest.Bolt(t)
	toks := New(s)
	if any, err := toks.Any(ctx); err != nil || any {
		t.Fatalf("a fresh store has tokens: %v %v", any, err)
	}
	rec := APIToken{Name: "admin", TenantID: "default", Role: "admin", CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	text, err := toks.Create(ctx, rec)
	if err != nil || !strings.HasPrefix(text, TokenPrefix) {
		t.Fatalf("create: %q %v", text, err)
	}
	if any, err := toks.Any(ctx); err != nil || !any {
		t.Fatalf("after create: %v %v", any, err)
	}
	// Read by another console on the same store.
	got, err := New(s).Check(ctx, text)
	if err != nil || got != rec {
		t.Fatalf("check: %+v %v", got, err)
	}
	// Only the hash is stored.
	kvs, _, err := s.Range(ctx, Prefix, 0)
	if err != nil || len(kvs) != 1 || strings.Contains(kvs[0].Key+string(kvs[0].Value), text) ||
		strings.Contains(kvs[0].Key+string(kvs[0].Value), strings.TrimPrefix(text, TokenPrefix)) {
		t.Fatalf("stored: %+v %v", kvs, err)
	}
	for _, tc := range []struct{ name, text string }{
		{"unknown", TokenPrefix + "nope"},
		{"empty", ""},
		{"a letter changed", text[:len(text)-1] + string(rune(text[len(text)-1])^1)},
		{"too long", text + strings.Repeat("x", 200)},
	} {
		if _, err := toks.Check(ctx, tc.text); !errors.Is(err, errdefs.ErrPermission) {
			t.Errorf("%s: %v, want a permission error", tc.name, err)
		}
	}
}
