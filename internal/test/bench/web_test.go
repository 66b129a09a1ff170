package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
)

// BenchmarkWebFleet measures the web console's fleet page in headless
// Chromium against a console with EDGEBOX_BENCH_BOXES boxes (10,000 unless
// set; enrolled, their agents not running): the time from opening the
// page to its first row of boxes, the time a search takes to show its
// matches, and the main bundle's size, gzipped.
//
//	EDGEBOX_BENCH_BOXES=10000 go test -run '^$' -bench WebFleet -benchtime 1x -timeout 30m ./internal/test/bench/
func BenchmarkWebFleet(b *testing.B) {
	require.Tools(b, "apt-get install nodejs chromium (scripts/test-deps.sh)", "node", "chromium")
	_, file, _, _ := runtime.Caller(0)
	web := filepath.Join(filepath.Dir(file), "..", "..", "..", "web")
	require.File(b, filepath.Join(web, "node_modules", "playwright-core", "package.json"), "npm ci in web/ (scripts/test-deps.sh)")
	n := envInt(b, "EDGEBOX_BENCH_BOXES", 10000)

	c, _, admin := startConsole(b)
	defer c.kill()
	f := startFleet(b, admin, n)
	defer f.Close()
	ctx := context.Background()
	if _, err := admin.CreateUser(ctx, api.UserRequest{Name: "bench", Password: "a long bench password", Role: "viewer"}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if bs, err := admin.Boxes(ctx); err != nil || len(bs) != n {
		b.Fatalf("boxes: %d %v", len(bs), err)
	}
	b.Logf("the API lists %d boxes in %v", n, time.Since(start).Round(time.Millisecond))

	b.ResetTimer()
	cmd := exec.Command("node", filepath.Join("tests", "fleet-bench.mjs"))
	cmd.Dir = web
	cmd.Env = append(os.Environ(), "EDGEBOX_URL="+c.url, "EDGEBOX_USER=bench", "EDGEBOX_PASSWORD=a long bench password",
		"EDGEBOX_BOXES="+strconv.Itoa(n))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		b.Fatalf("fleet-bench.mjs: %v\n%s%s", err, out.String(), errb.String())
	}
	b.StopTimer()
	var res struct {
		FirstRenderMs float64   `json:"first_render_ms"`
		SearchMs      []float64 `json:"search_ms"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		b.Fatalf("fleet-bench.mjs printed %q: %v", out.String(), err)
	}
	worst := 0.0
	for _, s := range res.SearchMs {
		worst = max(worst, s)
	}
	b.ReportMetric(res.FirstRenderMs, "first-render-ms")
	b.ReportMetric(worst, "search-max-ms")
	b.ReportMetric(bundleGzipKiB(b, filepath.Join(web, "..", "console", "webui", "dist")), "bundle-gzip-KiB")
	b.Logf("searches took %v ms", res.SearchMs)
}

// bundleGzipKiB is the gzipped size of the web console's scripts and
// styles that every page loads.
func bundleGzipKiB(b *testing.B, dist string) float64 {
	var total int
	err := filepath.WalkDir(filepath.Join(dist, "assets"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(p, ".js") || strings.HasSuffix(p, ".css")) {
			return err
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var z bytes.Buffer
		w, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
		w.Write(raw)
		w.Close()
		total += z.Len()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return float64(total) / 1024
}
