package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// maxCopySize bounds one file copied to a box; copyStall how long a copy
// may move no byte before its connection is given up.
const (
	maxCopySize = 4 << 30
	copyStall   = time.Minute
)

// fileRequest reads ?path=&volume= and finds the box, online.
func (s *server) fileRequest(c *gin.Context) (fleet.Box, *edgeboxv1.FileRequest, edgeboxv1.AgentServiceClient, func(), bool) {
	b, ok := s.findBox(c)
	if !ok {
		return b, nil, nil, nil, false
	}
	r := &edgeboxv1.FileRequest{Path: c.Query("path"), Volume: c.Query("volume")}
	if r.Path == "" || len(r.Path) > 4096 || len(r.Volume) > 200 {
		fail(c, errdefs.Invalid("path: give the file's path on the box (absolute, or within --volume APP/VOLUME)"))
		return b, nil, nil, nil, false
	}
	if s.refuseFourEyes(c, b, "copy files there from an approved shell") {
		return b, nil, nil, nil, false
	}
	if !s.Sessions.Presence(b.ID).Online {
		fail(c, errdefs.Unavailable("box %s is offline; a copy needs it online", b.Name))
		return b, nil, nil, nil, false
	}
	conn, err := s.Agents.Conn(b.ID)
	if err != nil {
		s.fail(c, err)
		return b, nil, nil, nil, false
	}
	return b, r, edgeboxv1.NewAgentServiceClient(conn), func() { conn.Close() }, true
}

// boxFileError maps a box's answer to the API's errors.
func boxFileError(box string, err error) error {
	err = errgrpc.ToNative(err)
	if errdefs.Kind(err) == nil {
		return errdefs.Unavailable("box %s: %v", box, err)
	}
	return fmt.Errorf("box %s: %w", box, err)
}

func fileInfo(fi *edgeboxv1.FileInfo) api.FileInfo {
	return api.FileInfo{Exists: fi.GetExists(), Size: fi.GetSize(), Mode: fi.GetMode(), MtimeUnix: fi.GetMtimeUnix(),
		SHA256: fi.GetSha256(), PartSize: fi.GetPartSize(), Complete: fi.GetComplete(), IsDir: fi.GetIsDir()}
}

// statFile says what is at a path on a box, and how much of an upload
// to it is there (?sha256=1 adds the file's SHA-256).
func (s *server) statFile(c *gin.Context) {
	b, r, ac, done, ok := s.fileRequest(c)
	if !ok {
		return
	}
	defer done()
	r.Sha256 = c.Query("sha256") == "1"
	ctx, cancel := context.WithTimeout(c.Request.Context(), 5*time.Minute)
	defer cancel()
	fi, err := ac.StatFile(ctx, r)
	if err != nil {
		s.fail(c, boxFileError(b.Name, err))
		return
	}
	c.JSON(http.StatusOK, fileInfo(fi))
}

// readFile sends a file from a box; "Range: bytes=N-" resumes a download.
func (s *server) readFile(c *gin.Context) {
	b, r, ac, done, ok := s.fileRequest(c)
	if !ok {
		return
	}
	defer done()
	ctx := c.Request.Context()
	fi, err := ac.StatFile(ctx, r)
	if err != nil {
		s.fail(c, boxFileError(b.Name, err))
		return
	}
	if !fi.GetExists() || fi.GetIsDir() {
		fail(c, errdefs.NotFound("no file %s on box %s", truncate(r.Path, 128), b.Name))
		return
	}
	status := http.StatusOK
	if rg := c.GetHeader("Range"); rg != "" {
		from, ok := strings.CutPrefix(rg, "bytes=")
		from, open := strings.CutSuffix(from, "-")
		n, err := strconv.ParseInt(from, 10, 64)
		if !ok || !open || err != nil || n < 0 || n > fi.GetSize() {
			c.Header("Content-Range", fmt.Sprintf("bytes */%d", fi.GetSize()))
			fail(c, errdefs.Invalid("Range %q: only bytes=N- up to the file's %d bytes", truncate(rg, 64), fi.GetSize()))
			return
		}
		r.Offset, status = n, http.StatusPartialContent
		c.Header("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, max(n, fi.GetSize()-1), fi.GetSize()))
	}
	stream, err := ac.ReadFile(ctx, r)
	if err != nil {
		s.fail(c, boxFileError(b.Name, err))
		return
	}
	first, err := stream.Recv()
	if err != nil && !errors.Is(err, io.EOF) {
		s.fail(c, boxFileError(b.Name, err))
		return
	}
	t0 := time.Now()
	c.Header("Content-Length", strconv.FormatInt(fi.GetSize()-r.Offset, 10))
	c.Header("Content-Type", "application/octet-stream")
	c.Header("Accept-Ranges", "bytes")
	c.Status(status)
	var sent int64
	rc := http.NewResponseController(c.Writer)
	for chunk := first; chunk != nil; {
		rc.SetWriteDeadline(time.Now().Add(copyStall)) // a reader that takes nothing has gone
		n, werr := c.Writer.Write(chunk.GetData())
		sent += int64(n)
		if werr != nil {
			break
		}
		if chunk, err = stream.Recv(); err != nil {
			break
		}
	}
	s.auditCopy(ctx, caller(c), "file.read", b, r, r.Offset, sent, t0, sent == fi.GetSize()-r.Offset)
}

// writeFile takes part of an upload: the body is the file's bytes from
// ?offset=, of a file of ?size= bytes with ?sha256=; the answer says how
// far the box's part is, and whether the file is whole and in place.
func (s *server) writeFile(c *gin.Context) {
	b, r, ac, done, ok := s.fileRequest(c)
	if !ok {
		return
	}
	defer done()
	num := func(name string) (int64, bool) {
		n, err := strconv.ParseInt(c.Query(name), 10, 64)
		if err != nil || n < 0 || n > maxCopySize {
			fail(c, errdefs.Invalid("%s %q: a number of bytes up to %d", name, truncate(c.Query(name), 32), maxCopySize))
			return 0, false
		}
		return n, true
	}
	size, ok1 := num("size")
	if !ok1 {
		return
	}
	offset, ok2 := num("offset")
	if !ok2 {
		return
	}
	mode := uint64(0)
	if m := c.Query("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o777 {
			fail(c, errdefs.Invalid("mode %q: octal permission bits", truncate(m, 16)))
			return
		}
	}
	if offset > size {
		fail(c, errdefs.Invalid("offset %d past the file's size %d", offset, size))
		return
	}
	ctx := c.Request.Context()
	stream, err := ac.WriteFile(ctx)
	if err == nil {
		err = stream.Send(&edgeboxv1.FileChunk{Header: &edgeboxv1.FileHeader{Path: r.Path, Volume: r.Volume, Offset: offset,
			Size: size, Sha256: c.Query("sha256"), Mode: uint32(mode)}})
	}
	if err != nil {
		s.fail(c, boxFileError(b.Name, err))
		return
	}
	t0 := time.Now()
	body := http.MaxBytesReader(c.Writer, c.Request.Body, size-offset)
	buf := make([]byte, 64<<10)
	var sent int64
	rc := http.NewResponseController(c.Writer)
	for {
		// An uploader that sends nothing for copyStall has gone: what came
		// stays in the box's part for the next try.
		rc.SetReadDeadline(time.Now().Add(copyStall))
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			if err := stream.Send(&edgeboxv1.FileChunk{Data: buf[:n]}); err != nil {
				break // the box's answer says why
			}
			sent += int64(n)
		}
		if rerr != nil {
			break // the body ended, whole or cut: the box keeps what came
		}
	}
	fi, err := stream.CloseAndRecv()
	s.auditCopy(ctx, caller(c), "file.write", b, r, offset, sent, t0, fi.GetComplete())
	if err != nil {
		s.fail(c, boxFileError(b.Name, err))
		return
	}
	c.JSON(http.StatusOK, fileInfo(fi))
}

// auditCopy records one part of a copy: who, box, file, bytes, time.
func (s *server) auditCopy(ctx context.Context, who audit.Actor, action string, b fleet.Box, r *edgeboxv1.FileRequest, offset, n int64, t0 time.Time, whole bool) {
	where := r.Path
	if r.Volume != "" {
		where = r.Volume + ":" + r.Path
	}
	e := who.Did(action, "box/"+b.ID, fmt.Sprintf("%s: %d bytes from offset %d in %v; whole: %v", truncate(where, 256), n, offset,
		time.Since(t0).Round(time.Millisecond), whole))
	if err := s.Audit.Append(context.WithoutCancel(ctx), e); err != nil {
		s.Log.Error("a file copy could not be audited", "box", b.ID, "err", err)
	}
}
