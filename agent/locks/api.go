package locks

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/netutil"

	"github.com/edgebox/edgebox/errdefs"
)

// TakeRequest is the body of PUT /v1/locks/{holder}.
type TakeRequest struct {
	Reason     string `json:"reason,omitempty"`
	TTLSeconds int    `json:"ttl_seconds,omitempty"` // 600 when 0, at most 3600
}

// List is the answer to GET /v1/locks.
type List struct {
	Locks []Lock `json:"locks"`
}

type apiError struct {
	Error string `json:"error"`
}

// maxConns bounds the local API's open connections: a workload that
// opens many cannot lock the others out for long (each ends within the
// server's timeouts).
const maxConns = 32

// Handler is the local API over s:
//
//	GET    /v1/locks           the locks held
//	PUT    /v1/locks/{holder}  take or renew holder's lock: {"reason": "...", "ttl_seconds": 600}
//	DELETE /v1/locks/{holder}  release it
func Handler(s *Set) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	fail := func(w http.ResponseWriter, err error) {
		code := http.StatusInternalServerError
		switch errdefs.Kind(err) {
		case errdefs.ErrInvalid:
			code = http.StatusBadRequest
		case errdefs.ErrNotFound:
			code = http.StatusNotFound
		case errdefs.ErrUnavailable:
			code = http.StatusServiceUnavailable
		}
		reply(w, code, apiError{Error: err.Error()})
	}
	mux.HandleFunc("GET /v1/locks", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, List{Locks: s.Held()})
	})
	mux.HandleFunc("PUT /v1/locks/{holder}", func(w http.ResponseWriter, r *http.Request) {
		var q TakeRequest
		if r.ContentLength != 0 {
			dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&q); err != nil {
				fail(w, errdefs.Invalid("request body: %v", err))
				return
			}
		}
		if q.TTLSeconds < 0 || q.TTLSeconds > int(MaxTTL/time.Second) {
			fail(w, errdefs.Invalid("ttl_seconds %d: from 1 to %d", q.TTLSeconds, int(MaxTTL/time.Second)))
			return
		}
		l, err := s.Take(r.PathValue("holder"), q.Reason, time.Duration(q.TTLSeconds)*time.Second)
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, l)
	})
	mux.HandleFunc("DELETE /v1/locks/{holder}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Release(r.PathValue("holder")); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// Serve answers the local API on ln until ctx ends, with at most
// maxConns connections at once and every request bounded in time.
func Serve(ctx context.Context, ln net.Listener, s *Set, log *slog.Logger) error {
	srv := &http.Server{Handler: Handler(s), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 8 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, stop := context.WithTimeout(context.Background(), 2*time.Second)
		defer stop()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(netutil.LimitListener(ln, maxConns))
	cancel()
	<-done
	if errors.Is(err, http.ErrServerClosed) || strings.Contains(errString(err), "use of closed") {
		return nil
	}
	return err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
