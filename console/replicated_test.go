package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/console/sitehealth"
)

// ask serves one call of body to serveBallots with method on path.
func ask(method, path string, body []byte) *httptest.ResponseRecorder {
	sites := sitehealth.NewService(sitehealth.ServiceConfig{})
	h := serveBallots(sites, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot) // the API, for every other path
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, path, bytes.NewReader(body)))
	return w
}

// TestServeBallots: the replica listener answers an ask for site votes,
// refuses a malformed or oversized one with a clear reason, and passes
// every other call to the API.
func TestServeBallots(t *testing.T) {
	if w := ask(http.MethodPost, ballotsPath, []byte(`{"voters":["a","b"]}`)); w.Code != http.StatusOK || !json.Valid(w.Body.Bytes()) {
		t.Fatalf("an ask: %d %s", w.Code, w.Body)
	}
	if w := ask(http.MethodGet, "/api/v1/boxes", nil); w.Code != http.StatusTeapot {
		t.Fatalf("another call: %d, want it passed to the API", w.Code)
	}
	many, _ := json.Marshal(ballotsQuery{Voters: strings.Split(strings.Repeat("x,", sitehealth.MaxVotersAsked+1), ",")})
	for _, c := range []struct {
		name, method string
		body         []byte
		code         int
		why          string
	}{
		{"a GET", http.MethodGet, nil, http.StatusMethodNotAllowed, "POST"},
		{"not JSON", http.MethodPost, []byte("voters=a"), http.StatusBadRequest, "a list of voters"},
		{"too many voters", http.MethodPost, many, http.StatusBadRequest, fmt.Sprintf("at most %d", sitehealth.MaxVotersAsked)},
		{"too long", http.MethodPost, append([]byte(`{"voters":["`), bytes.Repeat([]byte("y"), maxBallotsQuery)...), http.StatusBadRequest, "too large"},
	} {
		if w := ask(c.method, ballotsPath, c.body); w.Code != c.code || !strings.Contains(w.Body.String(), c.why) {
			t.Errorf("%s: %d %q, want %d saying %q", c.name, w.Code, w.Body.String(), c.code, c.why)
		}
	}
}

// FuzzServeBallots: whatever another replica sends, the answer is the
// votes or a refusal, never a panic.
func FuzzServeBallots(f *testing.F) {
	f.Add([]byte(`{"voters":["a","b"]}`))
	f.Add([]byte(`{"voters":null}`))
	f.Add([]byte(`{"voters":[1,2]}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, body []byte) {
		switch w := ask(http.MethodPost, ballotsPath, body); w.Code {
		case http.StatusOK:
			var a ballotsAnswer
			if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
				t.Fatalf("an answer that is not JSON: %v", err)
			}
		case http.StatusBadRequest:
		default:
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	})
}
