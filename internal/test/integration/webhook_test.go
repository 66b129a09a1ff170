package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/edgebox/edgebox/api"
)

// webhook is an alert receiver: it refuses its first fail posts with a
// 503, then records what it takes.
type webhook struct {
	*httptest.Server
	mu    sync.Mutex
	fail  int
	tried int
	posts []alertPost
}

// alertPost is what the console posts to a webhook.
type alertPost struct {
	Delivery string       `json:"delivery"`
	Status   string       `json:"status"`
	Tenant   string       `json:"tenant"`
	Incident api.Incident `json:"incident"`
}

func newWebhook(t *testing.T, fail int) *webhook {
	w := &webhook{fail: fail}
	w.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		w.mu.Lock()
		defer w.mu.Unlock()
		w.tried++
		if w.fail > 0 {
			w.fail--
			http.Error(rw, "not now", http.StatusServiceUnavailable)
			return
		}
		var p alertPost
		if err == nil {
			err = json.Unmarshal(body, &p)
		}
		if err != nil {
			t.Errorf("the webhook took a post it cannot read: %v: %s", err, body)
		}
		w.posts = append(w.posts, p)
	}))
	t.Cleanup(w.Close)
	return w
}

// took returns what the webhook took, in order.
func (w *webhook) took() []alertPost {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]alertPost(nil), w.posts...)
}

// tries counts the posts that reached it, refused ones too.
func (w *webhook) tries() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tried
}
